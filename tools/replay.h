/* replay.h: replaying a trace through a stash heap on the simulated device. */
#ifndef STASH_REPLAY_H
#define STASH_REPLAY_H

#include <stdint.h>

#include "stash.h"
#include "stash_provider.h"
#include "trace.h"

typedef struct replay_result_s {
  uint64_t events;
  uint64_t peak_live_bytes;      /* from the trace: sum of requested sizes live at once */
  uint64_t peak_reserved_bytes;  /* reserved_bytes.all.peak */
  uint64_t peak_allocated_bytes; /* allocated_bytes.all.peak */
  uint64_t peak_active_bytes;    /* active_bytes.all.peak */
  uint64_t device_allocs;        /* num_device_alloc */
  uint64_t device_frees;         /* num_device_free */
  uint64_t alloc_retries;        /* num_alloc_retries */
  uint64_t ooms;                 /* allocations that failed with out of memory */
  uint64_t first_oom_line;       /* line of the first failed allocation (0: none) */
  double ns_per_event;           /* host wall time of the replay loop per event */
  double modeled_driver_us;      /* the provider calls' modelled cost (simulated device) */
  uint64_t device_allocs_second_half; /* calls that allocate or map, in the second half */
  uint64_t device_frees_second_half;  /* calls that unmap or free, in the second half */
  /* --driver-check (a GPU): the device memory the driver reports in use (cuMemGetInfo,
   * less what was in use before the heap existed), read whenever the heap's reserved
   * bytes changed. */
  bool driver_checked;
  uint64_t driver_checks;          /* readings taken */
  uint64_t driver_used_at_peak;    /* the reading when reserved bytes were at their peak */
  int64_t driver_gap_max;          /* the largest |driver in use - reserved| seen */
  uint64_t calls[STASH_CALL_COUNT];  /* simulated: provider calls of each kind */
  double driver_us[STASH_CALL_COUNT]; /* simulated: their modelled cost */
  stash_stats_t stats;           /* the heap's statistics at the end */
} replay_result_t;

typedef struct replay_opts_s {
  bool cuda;            /* replay on a real GPU through the CUDA provider (else: simulated) */
  int device;           /* the GPU, with cuda */
  uint64_t capacity;    /* the simulated device's bytes (0: an H200) */
  uint64_t check_every; /* if non-zero: check the heap every so many events */
  bool driver_check;    /* with cuda: compare the driver's memory in use with reserved */
} replay_opts_t;

/* Replay t under conf on a fresh simulated device (or a real GPU). Returns STASH_OK or the
 * first error that is not out of memory (with stash_last_error()). If check_every is
 * non-zero, stash_heap_check runs after every check_every events and, on the simulated
 * device, every live allocation is checked for being usable memory that overlaps no
 * other. */
stash_status_t replay_run(const trace_t* t, const stash_conf_t* conf, const replay_opts_t* opts,
                          replay_result_t* out);

#endif
