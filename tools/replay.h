/* replay.h: replaying a trace through a stash heap on the simulated device. */
#ifndef STASH_REPLAY_H
#define STASH_REPLAY_H

#include <stdint.h>
#include <stdio.h>

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
  uint64_t first_oom_event;      /* its event number (1-based) */
  uint64_t first_oom_size;       /* the bytes it asked for */
  uint64_t first_oom_live_bytes; /* what the trace had live then (served allocations) */
  uint64_t first_oom_live_count; /* in how many allocations */
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
  uint64_t calls[STASH_CALL_COUNT];  /* provider calls of each kind (on a GPU too) */
  double driver_us[STASH_CALL_COUNT]; /* simulated: their modelled cost; on a GPU: their
                                         measured wall time (timed_provider.h) */
  double measured_driver_us;     /* on a GPU: the heap's provider calls' wall time, us */
  stash_stats_t stats;           /* the heap's statistics at the end */
  /* With opts.series: live (requested bytes of served allocations) and reserved bytes after
   * every event (events entries each); free with replay_result_free. */
  uint64_t* series_live;
  uint64_t* series_reserved;
  double* series_driver_us; /* simulated: the modelled driver time so far (else NULL) */
  /* With opts.layout or opts.explain: the heap's segments and blocks when reserved first
   * reached its peak. */
  struct replay_segment_s* layout;
  size_t nlayout;
  uint64_t layout_event;         /* the event after which it was taken */
  uint64_t empty_caches;         /* --empty-cache-between-steps: calls made */
  uint64_t lag;                  /* simulated: opts.lag */
  stash_account_t peak_account[2]; /* then, stash_heap_account of each pool: [0] small */
} replay_result_t;

typedef struct replay_block_s {
  uint64_t address, size;
  int state; /* stash_block_state_t */
} replay_block_t;

typedef struct replay_segment_s {
  uint64_t address, size;
  bool small, stitched; /* stitched: a policy:stash range over memory shown elsewhere */
  replay_block_t* blocks;
  size_t nblocks;
} replay_segment_t;

typedef struct replay_opts_s {
  bool cuda;            /* replay on a real GPU through the CUDA provider (else: simulated) */
  int device;           /* the GPU, with cuda */
  uint64_t capacity;    /* the simulated device's bytes (0: an H200) */
  uint64_t check_every; /* if non-zero: check the heap every so many events */
  bool driver_check;    /* with cuda: compare the driver's memory in use with reserved */
  bool series;          /* record live and reserved bytes after every event */
  bool layout;          /* keep the heap's layout at the peak */
  /* Simulated: place each new plain segment (cudaMalloc) at the address the traced program
   * got for the allocation that made it, where that range is free (stash_sim_place_at):
   * the traced process's own driver layout, so that ties PyTorch breaks by address break
   * the same way. */
  bool trace_addresses;
  /* Call stash_heap_empty_cache whenever live bytes fall under a quarter of their peak so
   * far after having been over half of it since the last call: between training steps, as a
   * program that calls torch.cuda.empty_cache() after each step. */
  bool empty_cache_between_steps;
  /* Simulated: the GPU runs `lag` events behind the host - after event i, the work each
   * stream queued up to event i - lag has completed, not all of it (0: every stream's work
   * completes by the next event). Events recorded for cross-stream reuse complete that much
   * later. */
  uint64_t lag;
  /* If set: one line here for every allocation that made reserved bytes grow (or ran out of
   * memory), with the free memory of its pool just before it - why it did not fit. (The
   * caller prints where the memory was at the peak: replay_peak_text.) */
  FILE* explain;
  /* If set: one line here for every event that made provider calls, with their kinds, bytes
   * and modelled cost (on a GPU: measured wall time), then the totals (call_log.h): where
   * modeled_driver_us (measured_driver_us) went. */
  FILE* calls;
  /* Called now and then with the events done so far (e.g. a progress bar). */
  void (*progress)(uint64_t done, uint64_t total, void* arg);
  void* progress_arg;
} replay_opts_t;

/* Replay t under conf on a fresh simulated device (or a real GPU). Returns STASH_OK or the
 * first error that is not out of memory (with stash_last_error()). If check_every is
 * non-zero, stash_heap_check runs after every check_every events and, on the simulated
 * device, every live allocation is checked for being usable memory that overlaps no
 * other, and with several streams every allocation for taking no memory another stream
 * freed before that stream's work on it is done (stash_sim_ordered_after), unless it waits
 * for it. */
stash_status_t replay_run(const trace_t* t, const stash_conf_t* conf, const replay_opts_t* opts,
                          replay_result_t* out);
/* Free what replay_run allocated in r (series, layout). */
void replay_result_free(replay_result_t* r);

/* Where one pool's reserved bytes were when reserved first reached its peak, in words
 * (stash_account_text of the account taken with the layout: replay with opts.layout or
 * opts.explain), for --explain and the HTML page; false, and nothing written, when the pool
 * held no memory at the peak. */
bool replay_peak_text(const replay_result_t* r, bool small, char* buf, size_t size);

#endif
