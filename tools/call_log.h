/* call_log.h: stash-replay --calls - which events of a trace the modelled driver time went to.
 *
 * The replay hands call_log_hook to the simulated device (stash_sim_on_call), which tells it
 * every provider call with its modelled cost - or, on a GPU, to the provider that measures
 * the heap's calls on their way to the driver (timed_provider.h); after each event the replay calls
 * call_log_event, which writes one line for an event that made calls (what the event was,
 * the calls by kind with their bytes and microseconds, the running total), and at the end
 * call_log_end writes the totals by kind, by tenth of the trace and the costliest events.
 * Every microsecond of stash-replay's `modeled_driver_us` (`measured_driver_us`) is on
 * exactly one line.
 */
#ifndef STASH_CALL_LOG_H
#define STASH_CALL_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "stash_provider.h"

#define CALL_LOG_TOP 5 /* the costliest events listed at the end */

typedef struct call_log_s {
  FILE* f;
  uint64_t nevents; /* the trace's, for the tenths */
  bool measured;    /* the microseconds are measured wall time (a GPU), not modelled */
  /* the calls since the last line, by kind: how many, their bytes, their microseconds */
  uint64_t n[STASH_CALL_COUNT], bytes[STASH_CALL_COUNT];
  double us[STASH_CALL_COUNT];
  /* the whole replay's */
  uint64_t total_n[STASH_CALL_COUNT];
  double total_us[STASH_CALL_COUNT], total, tenth[10];
  struct {
    uint64_t event, line;
    double us;
  } top[CALL_LOG_TOP];
  int ntop;
} call_log_t;

/* Start a log written to f for a trace of nevents events; measured: its microseconds are
 * measured (a GPU), not modelled (the simulated device). */
void call_log_begin(call_log_t* L, FILE* f, uint64_t nevents, bool measured);
/* The stash_sim_call_fn: arg is the call_log_t. */
void call_log_hook(void* arg, stash_provider_call_t call, uint64_t bytes, double us);
/* The calls since the last line were made by event `event` (1-based; 0: creating the heap,
 * before the first event), line `line` of the trace, an allocation (alloc) or a free of
 * `size` bytes: one line, if there were any. */
void call_log_event(call_log_t* L, uint64_t event, uint64_t line, bool alloc, uint64_t size);
/* The totals, once every event's line is written (before the heap is destroyed: its calls
 * are not in modeled_driver_us). */
void call_log_end(call_log_t* L);

#endif
