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

#include "call_log.h"
#include "stash_provider.h"
#include "timed_provider.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ---- The per-event check: every live allocation usable, apart from every other ------------ */

typedef struct span_s {
  uint64_t start, size;
} span_t;

typedef struct check_ctx_s {
  const stash_sim_t* sim;
  int device;
  span_t* va;      /* live blocks: address, size */
  span_t* phys;    /* the physical memory behind them */
  size_t nva, cap_va, nphys, cap_phys;
  int bad;
  char msg[256];
} check_ctx_t;

static bool push(span_t** v, size_t* n, size_t* cap, uint64_t start, uint64_t size) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 256;
    span_t* w = realloc(*v, c * sizeof *w);
    if (!w) return false;
    *v = w;
    *cap = c;
  }
  (*v)[(*n)++] = (span_t){start, size};
  return true;
}

static int cmp_span(const void* a, const void* b) {
  const span_t* x = a;
  const span_t* y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

static int collect_block(const stash_segment_info_t* seg, const stash_block_info_t* b, void* arg) {
  check_ctx_t* c = arg;
  (void)seg;
  for (size_t i = 0; i < seg->nblocks && !c->bad; i++) {
    if (b[i].state != STASH_BLOCK_ALLOCATED) continue;
    if (b[i].address % 512 || b[i].size < b[i].requested_size || !b[i].size) {
      snprintf(c->msg, sizeof c->msg, "allocation 0x%llx (%zu bytes for %zu) is unaligned or short",
               (unsigned long long)b[i].address, b[i].size, b[i].requested_size);
      c->bad = 1;
      break;
    }
    if (!push(&c->va, &c->nva, &c->cap_va, b[i].address, b[i].size)) c->bad = 2;
    for (uint64_t at = b[i].address, left = b[i].size; left && !c->bad;) {
      uint64_t phys = 0;
      size_t run = stash_sim_translate(c->sim, c->device, at, left, &phys);
      if (!run) {
        snprintf(c->msg, sizeof c->msg, "allocation 0x%llx (%zu bytes) is not usable memory at 0x%llx",
                 (unsigned long long)b[i].address, b[i].size, (unsigned long long)at);
        c->bad = 1;
        break;
      }
      if (!push(&c->phys, &c->nphys, &c->cap_phys, phys, run)) c->bad = 2;
      at += run;
      left -= run;
    }
  }
  return c->bad;
}

static bool overlapping(span_t* v, size_t n, uint64_t* where) {
  if (n < 2) return false; /* (and qsort may not be given a NULL array) */
  qsort(v, n, sizeof *v, cmp_span);
  for (size_t i = 1; i < n; i++) {
    if (v[i].start < v[i - 1].start + v[i - 1].size) {
      *where = v[i].start;
      return true;
    }
  }
  return false;
}

/* Every live allocation is usable memory of at least the size asked for, aligned to 512
 * bytes, and shares neither addresses nor physical memory with another. */
static bool check_live(stash_heap_t* heap, check_ctx_t* c) {
  c->nva = c->nphys = 0;
  c->bad = 0;
  stash_heap_visit(heap, collect_block, c);
  if (c->bad == 2) snprintf(c->msg, sizeof c->msg, "out of host memory");
  if (c->bad) return false;
  uint64_t where = 0;
  if (overlapping(c->va, c->nva, &where)) {
    snprintf(c->msg, sizeof c->msg, "allocations overlap at 0x%llx", (unsigned long long)where);
    return false;
  }
  if (overlapping(c->phys, c->nphys, &where)) {
    snprintf(c->msg, sizeof c->msg, "allocations share physical memory (0x%llx)",
             (unsigned long long)where);
    return false;
  }
  return true;
}

/* ---- The cross-stream check: memory a stream freed reaches another only once safe ---------- */

/* Physical bytes freed on a trace stream, the point that stream's work had reached then, and
 * the event: a run older than the lag's events is complete, and is dropped. */
typedef struct freed_run_s {
  uint64_t phys, len, point;
  size_t stream, event;
} freed_run_t;

typedef struct handover_s {
  stash_sim_t* sim;
  void** streams;
  freed_run_t* v;
  size_t n, cap;
  char msg[256];
} handover_t;

/* Note the physical runs behind [ptr, ptr + size), freed on trace stream `stream` at event i,
 * its work having reached `point`. */
static bool note_freed(handover_t* h, uint64_t ptr, uint64_t size, size_t stream,
                       uint64_t point, size_t i) {
  for (uint64_t at = ptr, left = size; left;) {
    uint64_t phys = 0;
    size_t run = stash_sim_translate(h->sim, 0, at, left, &phys);
    if (!run) return true; /* (check_live reports memory that is not usable) */
    if (h->n == h->cap) {
      size_t c = h->cap ? 2 * h->cap : 256;
      freed_run_t* w = realloc(h->v, c * sizeof *w);
      if (!w) return false;
      h->v = w;
      h->cap = c;
    }
    h->v[h->n++] = (freed_run_t){phys, run, point, stream, i};
    at += run;
    left -= run;
  }
  return true;
}

/* [ptr, ptr + size), just handed out on trace stream `stream` at event i: no byte of it that
 * another stream freed is still in that stream's work, unless `stream` waits for it. Runs
 * freed more than `lag` events ago are complete by now and go. */
static bool handed_over_safely(handover_t* h, uint64_t ptr, uint64_t size, size_t stream,
                               size_t i, uint64_t lag) {
  for (size_t k = 0; k < h->n;) {
    if (h->v[k].event + lag < i) h->v[k] = h->v[--h->n];
    else k++;
  }
  for (uint64_t at = ptr, left = size; left;) {
    uint64_t phys = 0;
    size_t run = stash_sim_translate(h->sim, 0, at, left, &phys);
    if (!run) return true;
    for (size_t k = 0; k < h->n; k++) {
      const freed_run_t* f = &h->v[k];
      if (f->stream == stream || f->phys >= phys + run || phys >= f->phys + f->len) continue;
      if (stash_sim_ordered_after(h->sim, h->streams[f->stream], f->point, h->streams[stream]))
        continue;
      snprintf(h->msg, sizeof h->msg,
               "0x%llx (%llu bytes) on stream %zu takes memory stream %zu freed at event %zu, "
               "before that stream's work on it is done and without waiting for it",
               (unsigned long long)ptr, (unsigned long long)size, stream, f->stream,
               f->event + 1);
      return false;
    }
    at += run;
    left -= run;
  }
  return true;
}

/* ---- The layout at the peak ----------------------------------------------------------- */

typedef struct layout_ctx_s {
  replay_segment_t* v;
  size_t n, cap;
  bool failed;
} layout_ctx_t;

static void layout_free(replay_segment_t* v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i].blocks);
  free(v);
}

static int layout_segment(const stash_segment_info_t* seg, const stash_block_info_t* b, void* arg) {
  layout_ctx_t* c = arg;
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 16;
    replay_segment_t* v = realloc(c->v, cap * sizeof *v);
    if (!v) {
      c->failed = true;
      return 1;
    }
    c->v = v;
    c->cap = cap;
  }
  replay_segment_t* s = &c->v[c->n];
  *s = (replay_segment_t){seg->address, seg->total_size, seg->is_small,
                          seg->is_expandable && seg->mapped_size == 0 && seg->total_size > 0,
                          NULL, 0};
  s->blocks = malloc((seg->nblocks ? seg->nblocks : 1) * sizeof *s->blocks);
  if (!s->blocks) {
    c->failed = true;
    return 1;
  }
  for (size_t i = 0; i < seg->nblocks; i++)
    s->blocks[i] = (replay_block_t){b[i].address, b[i].size, (int)b[i].state};
  s->nblocks = seg->nblocks;
  c->n++;
  return 0;
}

/* The free blocks of one pool (small or large): what a request of that pool could use. */
typedef struct free_stats_s {
  bool small;
  uint64_t bytes, count, largest;
} free_stats_t;

static int free_segment(const stash_segment_info_t* seg, const stash_block_info_t* b, void* arg) {
  free_stats_t* f = arg;
  if (seg->is_small != f->small) return 0;
  for (size_t i = 0; i < seg->nblocks; i++) {
    if (b[i].state != STASH_BLOCK_FREE) continue;
    f->bytes += b[i].size;
    f->count++;
    if (b[i].size > f->largest) f->largest = b[i].size;
  }
  return 0;
}

#define MIB(x) ((double)(x) / 1048576.0)

/* Replace out's layout by the heap's now. */
static void take_layout(stash_heap_t* heap, replay_result_t* out, uint64_t event) {
  layout_ctx_t c = {0};
  stash_heap_visit(heap, layout_segment, &c);
  if (c.failed) {
    layout_free(c.v, c.n);
    return;
  }
  stash_account_t acc[2];
  if (stash_heap_accounts(heap, &acc[0], &acc[1]) != STASH_OK) {
    layout_free(c.v, c.n);
    return;
  }
  layout_free(out->layout, out->nlayout);
  out->layout = c.v;
  out->nlayout = c.n;
  out->layout_event = event;
  memcpy(out->peak_account, acc, sizeof acc);
}

bool replay_peak_text(const replay_result_t* r, bool small, char* buf, size_t size) {
  if (!r->layout) return false;
  return stash_account_text(&r->peak_account[small ? 0 : 1], small, buf, size) > 0;
}

void replay_result_free(replay_result_t* r) {
  free(r->series_live);
  free(r->series_reserved);
  free(r->series_driver_us);
  r->series_driver_us = NULL;
  layout_free(r->layout, r->nlayout);
  r->series_live = r->series_reserved = NULL;
  r->layout = NULL;
  r->nlayout = 0;
}

/* Provider calls that allocate or map, and that unmap or free. */
static const stash_provider_call_t allocs[] = {STASH_CALL_mem_alloc, STASH_CALL_va_reserve,
                                               STASH_CALL_phys_create, STASH_CALL_map,
                                               STASH_CALL_set_access};
static const stash_provider_call_t frees[] = {STASH_CALL_mem_free, STASH_CALL_va_free,
                                              STASH_CALL_phys_release, STASH_CALL_unmap};
#define NALLOCS (sizeof allocs / sizeof allocs[0])
#define NFREES (sizeof frees / sizeof frees[0])

/* Calls of the given kinds so far: the simulated device's count, or (a GPU) the timing
 * provider's. */
static uint64_t calls_of(const stash_sim_t* sim, const timed_provider_t* timed,
                         const stash_provider_call_t* kinds, size_t n) {
  uint64_t c = 0;
  for (size_t k = 0; k < n; k++) c += sim ? stash_sim_calls(sim, kinds[k]) : timed->calls[kinds[k]];
  return c;
}

stash_status_t replay_run(const trace_t* t, const stash_conf_t* conf, const replay_opts_t* opts,
                          replay_result_t* out) {
  memset(out, 0, sizeof *out);
  stash_sim_t* sim = NULL;
  stash_heap_t* heap = NULL;
  void** ptrs = NULL;
  void** streams = NULL;
  const stash_provider_t* provider = NULL;
  int device = 0;
  uint64_t check_every = opts->check_every;
  check_ctx_t check = {.device = 0};
  handover_t handover = {0};
  uint64_t* lag_points = NULL; /* --lag: each stream's point after each of the last lag events */
  uint32_t* alloc_stream = NULL; /* the cross-stream check: each allocation's trace stream */
  stash_status_t st;
  if (opts->cuda) {
    st = stash_cuda_provider(&provider);
    device = opts->device;
  } else {
    st = stash_sim_create(1, opts->capacity, &sim);
    if (st == STASH_OK) provider = stash_sim_provider(sim);
    check.sim = sim;
  }
  if (st != STASH_OK) return st;
  /* Where the driver time goes: the simulated device tells its modelled cost of each call; on
   * a GPU the heap's calls go through a provider that measures them (the replay's own
   * cuMemGetInfo readings, --driver-check, do not). */
  call_log_t log;
  if (opts->calls) call_log_begin(&log, opts->calls, t->nevents, !sim);
  timed_provider_t timed;
  memset(&timed, 0, sizeof timed); /* (read for a GPU only) */
  const stash_provider_t* heap_provider = provider;
  if (sim) {
    if (opts->calls) stash_sim_on_call(sim, call_log_hook, &log);
  } else {
    /* A process's first driver call pays for setting its context up (cuMemGetInfo: 93-95 ms
     * on an H100, 21 us afterwards): made here, untimed, it is not charged to the heap. */
    size_t fr = 0, tot = 0;
    if (provider->mem_info) (void)provider->mem_info(provider->ctx, device, &fr, &tot);
    timed_provider_init(&timed, provider, opts->calls ? call_log_hook : NULL, &log);
    heap_provider = &timed.table;
  }
  st = stash_heap_create(conf, heap_provider, device, &heap);
  if (opts->calls) call_log_event(&log, 0, 0, false, 0);
  if (st != STASH_OK) goto done;
  ptrs = calloc(t->nallocs ? t->nallocs : 1, sizeof *ptrs);
  if (!ptrs) {
    st = STASH_ERR_HOST_OOM;
    goto done;
  }
  /* The trace's streams: on the simulated device their recorded values; on a GPU, real
   * streams (the driver would not take made-up ones), one per trace stream. */
  streams = calloc(t->nstreams ? t->nstreams : 1, sizeof *streams);
  if (!streams) {
    st = STASH_ERR_HOST_OOM;
    goto done;
  }
  for (size_t k = 0; k < t->nstreams; k++) {
    if (sim) {
      streams[k] = (void*)(uintptr_t)t->streams[k];
    } else {
      st = stash_cuda_stream_create(device, &streams[k]);
      if (st != STASH_OK) goto done;
    }
  }
  uint64_t lag = sim ? opts->lag : 0;
  if (lag && lag < t->nevents) { /* (a longer lag completes nothing: no points to keep) */
    if (t->nstreams && lag > SIZE_MAX / sizeof *lag_points / t->nstreams) {
      st = STASH_ERR_HOST_OOM;
      goto done;
    }
    lag_points = calloc(lag * (t->nstreams ? t->nstreams : 1), sizeof *lag_points);
    if (!lag_points) {
      st = STASH_ERR_HOST_OOM;
      goto done;
    }
  }
  /* Checked, several streams on the simulated device: every handover between streams. */
  bool check_handover = sim && check_every && t->nstreams > 1;
  if (check_handover) {
    alloc_stream = calloc(t->nallocs ? t->nallocs : 1, sizeof *alloc_stream);
    if (!alloc_stream) {
      st = STASH_ERR_HOST_OOM;
      goto done;
    }
  }
  handover.sim = sim;
  handover.streams = streams;
  size_t base_free = 0, total = 0;
  int64_t last_reserved = 0;
  bool driver_check = opts->driver_check && !sim && provider->mem_info;
  if (driver_check) {
    st = provider->mem_info(provider->ctx, device, &base_free, &total);
    if (st != STASH_OK) goto done;
    out->driver_checked = true;
  }
  uint64_t half_allocs = 0, half_frees = 0;
  uint64_t live = 0, nlive = 0, layout_peak = 0;
  uint64_t live_peak = 0; /* --empty-cache-between-steps: live bytes' peak so far ... */
  bool armed = false;     /* ... and whether they have been over half of it since the last call */
  if (opts->series) {
    out->series_live = malloc((t->nevents ? t->nevents : 1) * sizeof *out->series_live);
    out->series_reserved = malloc((t->nevents ? t->nevents : 1) * sizeof *out->series_reserved);
    if (sim) out->series_driver_us = malloc((t->nevents ? t->nevents : 1) * sizeof(double));
    if (!out->series_live || !out->series_reserved || (sim && !out->series_driver_us)) {
      st = STASH_ERR_HOST_OOM;
      goto done;
    }
  }
  size_t half = t->nevents / 2;
  double t0 = now_ns();
  for (size_t i = 0; i < t->nevents; i++) {
    const trace_event_t* e = &t->events[i];
    if (i == half) {
      half_allocs = calls_of(sim, &timed, allocs, NALLOCS);
      half_frees = calls_of(sim, &timed, frees, NFREES);
    }
    void* stream = streams[e->stream];
    if (e->op == TRACE_ALLOC) {
      free_stats_t fs = {.small = e->size <= ((uint64_t)1 << 20)};
      uint64_t res_before = 0;
      if (opts->explain) {
        res_before = stash_heap_reserved_bytes(heap);
        stash_heap_visit(heap, free_segment, &fs);
      }
      if (sim && opts->trace_addresses) stash_sim_place_at(sim, e->ptr);
      stash_status_t r = stash_heap_alloc(heap, e->size, stream, &ptrs[e->id]);
      if (sim && opts->trace_addresses) stash_sim_place_at(sim, 0);
      uint64_t res_after = opts->explain ? stash_heap_reserved_bytes(heap) : 0;
      if (opts->explain && (r == STASH_ERR_OOM || res_after > res_before)) {
        char what[96];
        if (r == STASH_ERR_OOM)
          snprintf(what, sizeof what, "out of memory at %.1f MiB reserved", MIB(res_before));
        else
          snprintf(what, sizeof what, "reserved %.1f -> %.1f MiB (+%.1f)", MIB(res_before),
                   MIB(res_after), MIB(res_after - res_before));
        fprintf(opts->explain,
                "event %zu (line %llu): %.1f MiB on stream %u: %s; live before it %.1f MiB, "
                "free %.1f MiB in %llu %s blocks, the largest %.1f MiB\n",
                i + 1, (unsigned long long)e->line, MIB(e->size), (unsigned)e->stream, what,
                MIB(live), MIB(fs.bytes), (unsigned long long)fs.count,
                fs.small ? "small-pool" : "large-pool", MIB(fs.largest));
      }
      if (r == STASH_ERR_OOM) {
        if (!out->ooms) {
          out->first_oom_line = e->line;
          out->first_oom_event = i + 1;
          out->first_oom_size = e->size;
          out->first_oom_live_bytes = live;
          out->first_oom_live_count = nlive;
        }
        out->ooms++;
      } else if (r != STASH_OK) {
        st = r;
        goto done;
      } else if (ptrs[e->id]) {
        if (check_handover && !handed_over_safely(&handover, (uint64_t)(uintptr_t)ptrs[e->id],
                                                  e->size, e->stream, i, lag)) {
          fprintf(stderr, "%s: event %zu (line %zu): %s\n", t->name, i + 1, (size_t)e->line,
                  handover.msg);
          st = STASH_ERR_INVALID;
          goto done;
        }
        if (check_handover) alloc_stream[e->id] = e->stream;
        live += e->size;
        nlive++;
        if (live > live_peak) live_peak = live;
        if (2 * live > live_peak) armed = true;
      }
    } else if (ptrs[e->id]) {
      /* (the work on a block is its allocation's stream's: stash_heap_free takes none, and a
       * trace's free may name another) */
      size_t owner = check_handover ? alloc_stream[e->id] : 0;
      uint64_t point = check_handover ? stash_sim_stream_point(sim, streams[owner]) : 0;
      st = stash_heap_free(heap, ptrs[e->id]);
      if (st != STASH_OK) goto done;
      if (check_handover && !note_freed(&handover, (uint64_t)(uintptr_t)ptrs[e->id], e->size,
                                        owner, point, i)) {
        st = STASH_ERR_HOST_OOM;
        goto done;
      }
      ptrs[e->id] = NULL;
      live -= e->size;
      nlive--;
      if (opts->empty_cache_between_steps && armed && live * 4 < live_peak) {
        armed = false; /* between two steps */
        st = stash_heap_empty_cache(heap);
        if (st != STASH_OK) goto done;
        out->empty_caches++;
      }
    }
    if (opts->calls) call_log_event(&log, i + 1, e->line, e->op == TRACE_ALLOC, e->size);
    if (opts->series || opts->layout || opts->explain) {
      uint64_t res = stash_heap_reserved_bytes(heap);
      if (opts->series) {
        out->series_live[i] = live;
        out->series_reserved[i] = res;
        if (sim) out->series_driver_us[i] = stash_sim_modeled_us(sim);
      }
      if ((opts->layout || opts->explain) && res > layout_peak) {
        layout_peak = res;
        take_layout(heap, out, i + 1);
      }
    }
    if (opts->progress && (i & 0xffff) == 0) opts->progress(i, t->nevents, opts->progress_arg);
    /* The GPU keeps up: the work queued so far on every stream is done by the next event
     * (events recorded for cross-stream reuse complete then). With a lag, the work queued up
     * to `lag` events ago is. */
    if (sim && !lag) {
      stash_sim_complete_all(sim);
    } else if (lag_points) {
      uint64_t* row = &lag_points[(i % lag) * t->nstreams]; /* event i - lag's, then i's */
      for (size_t k = 0; k < t->nstreams; k++) {
        if (i >= lag) stash_sim_complete_to(sim, streams[k], row[k]);
        row[k] = stash_sim_stream_point(sim, streams[k]);
      }
    }
    if (driver_check) {
      out->stats.size = sizeof out->stats;
      stash_heap_stats(heap, &out->stats);
      int64_t r = out->stats.reserved_bytes[STASH_STAT_ALL].current;
      if (r != last_reserved || i + 1 == t->nevents) {
        last_reserved = r;
        size_t fr = 0;
        st = provider->mem_info(provider->ctx, device, &fr, &total);
        if (st != STASH_OK) goto done;
        int64_t used = (int64_t)base_free - (int64_t)fr;
        int64_t gap = used > r ? used - r : r - used;
        if (gap > out->driver_gap_max) out->driver_gap_max = gap;
        if (r >= out->stats.reserved_bytes[STASH_STAT_ALL].peak) out->driver_used_at_peak = (uint64_t)used;
        out->driver_checks++;
      }
    }
    if (check_every && (i + 1) % check_every == 0) {
      st = stash_heap_check(heap);
      if (st != STASH_OK) goto done;
      if (!sim) continue;
      if (!check_live(heap, &check)) {
        fprintf(stderr, "%s: event %zu (line %zu): %s\n", t->name, i + 1, (size_t)e->line,
                check.msg);
        st = STASH_ERR_INVALID;
        goto done;
      }
    }
  }
  double t1 = now_ns();
  out->events = t->nevents;
  out->lag = lag;
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
  if (opts->calls) call_log_end(&log); /* (with the events' calls: before the heap goes) */
  /* The calls of each kind and their cost: modelled by the simulated device, or counted and
   * timed on their way to a GPU's driver. */
  for (int k = 0; k < STASH_CALL_COUNT; k++) {
    stash_provider_call_t c = (stash_provider_call_t)k;
    out->calls[k] = sim ? stash_sim_calls(sim, c) : timed.calls[k];
    out->driver_us[k] = sim ? stash_sim_modeled_us_of(sim, c) : timed.us[k];
  }
  if (sim)
    out->modeled_driver_us = stash_sim_modeled_us(sim);
  else
    out->measured_driver_us = timed.total_us;
  out->device_allocs_second_half = calls_of(sim, &timed, allocs, NALLOCS) - half_allocs;
  out->device_frees_second_half = calls_of(sim, &timed, frees, NFREES) - half_frees;
done:
  free(ptrs);
  if (heap) {
    stash_status_t d = stash_heap_destroy(heap);
    if (st == STASH_OK) st = d;
    heap = NULL;
  }
  if (streams && !sim) {
    for (size_t k = 0; k < t->nstreams; k++)
      if (streams[k]) stash_cuda_stream_destroy(streams[k]);
  }
  free(streams);
  free(check.va);
  free(check.phys);
  free(handover.v);
  free(lag_points);
  free(alloc_stream);
  if (heap) {
    stash_status_t d = stash_heap_destroy(heap);
    if (st == STASH_OK) st = d;
  }
  if (sim) stash_sim_on_call(sim, NULL, NULL);
  stash_sim_destroy(sim);
  return st;
}
