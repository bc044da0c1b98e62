/* replay.c: the replay engine behind stash-replay and the fidelity tests.
 *
 * Each trace stream becomes a simulated stream (its own handle value); each allocation
 * is made with the requested size on its stream and freed when the trace frees it. The
 * trace's frees come when PyTorch made the block reusable, so no event is needed.
 */
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stash_provider.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct check_ctx_s {
  const stash_sim_t* sim;
  int device;
  uint64_t last_end;
  int bad;
  char msg[256];
} check_ctx_t;

/* Every allocated block must be usable device memory, in address order without overlap. */
static int check_segment(const stash_segment_info_t* seg, const stash_block_info_t* b,
                         void* arg) {
  check_ctx_t* c = arg;
  if (seg->address < c->last_end) {
    snprintf(c->msg, sizeof c->msg, "segment 0x%llx overlaps the previous one",
             (unsigned long long)seg->address);
    c->bad = 1;
    return 1;
  }
  c->last_end = seg->address + seg->total_size;
  for (size_t i = 0; i < seg->nblocks; i++) {
    if (b[i].state != STASH_BLOCK_ALLOCATED) continue;
    if (b[i].address % 512 || b[i].size < b[i].requested_size ||
        !stash_sim_is_usable(c->sim, c->device, b[i].address, b[i].size)) {
      snprintf(c->msg, sizeof c->msg, "allocation 0x%llx (%zu bytes) is not usable memory",
               (unsigned long long)b[i].address, b[i].size);
      c->bad = 1;
      return 1;
    }
  }
  return 0;
}

stash_status_t replay_run(const trace_t* t, const stash_conf_t* conf, const replay_opts_t* opts,
                          replay_result_t* out) {
  memset(out, 0, sizeof *out);
  stash_sim_t* sim = NULL;
  stash_heap_t* heap = NULL;
  void** ptrs = NULL;
  const stash_provider_t* provider = NULL;
  int device = 0;
  uint64_t check_every = opts->check_every;
  stash_status_t st;
  if (opts->cuda) {
    st = stash_cuda_provider(&provider);
    device = opts->device;
  } else {
    st = stash_sim_create(1, opts->capacity, &sim);
    if (st == STASH_OK) provider = stash_sim_provider(sim);
  }
  if (st != STASH_OK) return st;
  st = stash_heap_create(conf, provider, device, &heap);
  if (st != STASH_OK) goto done;
  ptrs = calloc(t->nallocs ? t->nallocs : 1, sizeof *ptrs);
  if (!ptrs) {
    st = STASH_ERR_HOST_OOM;
    goto done;
  }
  /* Provider calls that allocate or map, and that unmap or free. */
  static const stash_provider_call_t allocs[] = {STASH_CALL_mem_alloc, STASH_CALL_va_reserve,
                                                 STASH_CALL_phys_create, STASH_CALL_map,
                                                 STASH_CALL_set_access};
  static const stash_provider_call_t frees[] = {STASH_CALL_mem_free, STASH_CALL_va_free,
                                                STASH_CALL_phys_release, STASH_CALL_unmap};
  uint64_t half_allocs = 0, half_frees = 0;
  size_t half = t->nevents / 2;
  double t0 = now_ns();
  for (size_t i = 0; i < t->nevents; i++) {
    const trace_event_t* e = &t->events[i];
    if (sim && i == half) {
      for (size_t k = 0; k < sizeof allocs / sizeof allocs[0]; k++)
        half_allocs += stash_sim_calls(sim, allocs[k]);
      for (size_t k = 0; k < sizeof frees / sizeof frees[0]; k++)
        half_frees += stash_sim_calls(sim, frees[k]);
    }
    void* stream = (void*)(uintptr_t)t->streams[e->stream];
    if (e->op == TRACE_ALLOC) {
      stash_status_t r = stash_heap_alloc(heap, e->size, stream, &ptrs[e->id]);
      if (r == STASH_ERR_OOM) {
        if (!out->ooms) out->first_oom_line = e->line;
        out->ooms++;
      } else if (r != STASH_OK) {
        st = r;
        goto done;
      }
    } else if (ptrs[e->id]) {
      st = stash_heap_free(heap, ptrs[e->id]);
      if (st != STASH_OK) goto done;
      ptrs[e->id] = NULL;
    }
    /* The GPU keeps up: the work queued so far on every stream is done by the next event
     * (events recorded for cross-stream reuse complete then). */
    if (sim)
      for (size_t k = 0; k < t->nstreams; k++) stash_sim_complete(sim, (void*)(uintptr_t)t->streams[k]);
    if (check_every && (i + 1) % check_every == 0) {
      st = stash_heap_check(heap);
      if (st != STASH_OK) goto done;
      if (!sim) continue;
      check_ctx_t c = {.sim = sim, .device = 0};
      stash_heap_visit(heap, check_segment, &c);
      if (c.bad) {
        fprintf(stderr, "%s: event %zu: %s\n", t->name, i + 1, c.msg);
        st = STASH_ERR_INVALID;
        goto done;
      }
    }
  }
  double t1 = now_ns();
  out->events = t->nevents;
  out->ns_per_event = t->nevents ? (t1 - t0) / (double)t->nevents : 0.0;
  out->peak_live_bytes = t->peak_live;
  out->stats.size = sizeof out->stats;
  stash_heap_stats(heap, &out->stats);
  out->peak_reserved_bytes = (uint64_t)out->stats.reserved_bytes[STASH_STAT_ALL].peak;
  out->peak_allocated_bytes = (uint64_t)out->stats.allocated_bytes[STASH_STAT_ALL].peak;
  out->peak_active_bytes = (uint64_t)out->stats.active_bytes[STASH_STAT_ALL].peak;
  out->device_allocs = (uint64_t)out->stats.num_device_alloc;
  out->device_frees = (uint64_t)out->stats.num_device_free;
  out->alloc_retries = (uint64_t)out->stats.num_alloc_retries;
  if (sim) {
    out->modeled_driver_us = stash_sim_modeled_us(sim);
    uint64_t a = 0, f = 0;
    for (size_t k = 0; k < sizeof allocs / sizeof allocs[0]; k++) a += stash_sim_calls(sim, allocs[k]);
    for (size_t k = 0; k < sizeof frees / sizeof frees[0]; k++) f += stash_sim_calls(sim, frees[k]);
    out->device_allocs_second_half = a - half_allocs;
    out->device_frees_second_half = f - half_frees;
  }
done:
  free(ptrs);
  if (heap) {
    stash_status_t d = stash_heap_destroy(heap);
    if (st == STASH_OK) st = d;
  }
  stash_sim_destroy(sim);
  return st;
}
