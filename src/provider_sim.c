/* provider_sim.c: the simulated device.
 *
 * A provider that touches no memory: it hands out deterministic addresses, accounts each
 * device's capacity at 2 MiB granularity, checks that every call is legal (the heap's bugs
 * become errors here), counts every call, simulates streams whose work completes only when
 * a test or the replayer says so, and fails calls on request (fault injection).
 *
 * Where plain allocations land matters: PyTorch breaks ties between equally good free
 * blocks by address, so a replay reproduces PyTorch's decisions only if its segments lie
 * in the same order in memory as on the real device. mem_alloc therefore places them as
 * the CUDA driver (580.159, H200) was measured to place cuMemAlloc allocations in a fresh
 * process (tools/gpu/va_probe.c; it predicts all 2,054 segment addresses of PyTorch's own
 * replays of the four shared traces under three settings, see docs/driver-placement.md):
 *  - address space is taken in chunks of a multiple of 32 MiB, each new chunk directly
 *    below the previous one (top down), the allocation at the chunk's start;
 *  - an allocation (rounded to 2 MiB) goes to the lowest free range of an existing chunk
 *    that fits, before a new chunk is taken;
 *  - at start two ranges already exist, as after the driver's own start-up: 2 MiB at the
 *    base and 24 MiB from base + 74 MiB; the first chunk ends 414 MiB below the base;
 *  - a chunk whose allocations are all freed is released; its range is not used again
 *    (the driver's reuse of released ranges was not pinned down).
 * Virtual ranges (va_reserve) come from a separate region, first fit.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SIM_VA_BASE 0x100000000000ULL  /* va_reserve ranges: from 16 TiB up */
#define SIM_VA_LIMIT 0x400000000000ULL
#define SIM_ALLOC_BASE 0x7f0000000000ULL /* mem_alloc: the driver-like layout below this */
#define SIM_CHUNK (32ULL << 20)          /* the driver's chunk granularity */
/* cuStreamWaitEvent's host time, as cuEventRecord's (0.20 us on the H200 of this table):
 * tools/gpu/wait_probe.c (medians of 2001) on two H100 machines found it 0.8-1.2 times
 * cuEventRecord's on the same machine - 0.34-0.45 us against 0.37-0.44 on one, 0.15-0.18
 * against 0.16-0.18 on the other (docs/results/gpu-check-47.md) */
#define SIM_STREAM_WAIT_US 0.20

typedef struct range_s {
  uint64_t start;
  uint64_t size;
} range_t;

typedef struct range_array_s {
  range_t* v;
  size_t n, cap;
} range_array_t;

/* A chunk of the driver-like mem_alloc layout: [start, start+size) with its free ranges. */
typedef struct chunk_s {
  uint64_t start, size;
  range_array_t free;
} chunk_t;

typedef struct handle_s {
  size_t size;
  int device;
  uint32_t maps;  /* pages currently mapped from it (a page may be mapped at several places) */
  bool released;  /* phys_release called; freed once unmapped */
} handle_t;

/* One map call: the pages it mapped point to it (for the cost of set_access and unmap,
 * which grows with the number of separately mapped pieces in the range). */
typedef struct piece_s {
  uint64_t handle;
  uint64_t va;     /* where the map call put it */
  uint64_t offset; /* and from which offset of the handle */
  uint64_t pages;  /* pages still mapped */
} piece_t;

/* A stream_wait: the stream's work queued after its `after`-th event waits for event `seq`
 * of stream `stream`. */
typedef struct sim_wait_s {
  uint64_t after;
  int stream;
  uint64_t seq;
} sim_wait_t;

typedef struct sim_stream_s {
  void* stream;
  uint64_t recorded;  /* events recorded so far */
  /* its work up to this point has completed: 2k is the work up to its k-th event, 2k + 1 all
   * the work queued after it (stash_sim_stream_point) */
  uint64_t done_point;
  sim_wait_t* waits;  /* the stream_waits its incomplete work is behind */
  size_t nwaits, cap_waits;
} sim_stream_t;

typedef struct sim_event_s {
  int device;
  int stream; /* index into streams, -1 if never recorded */
  uint64_t seq;
} sim_event_t;

typedef struct sim_device_s {
  size_t capacity;
  size_t used;
  range_array_t allocs;       /* live mem_alloc ranges, sorted */
  range_array_t reservations; /* live va_reserve ranges, sorted */
  size_t handles, pages, events;
} sim_device_t;

struct stash_sim_s {
  stash_provider_t table;
  pthread_mutex_t lock;
  int ndev;
  sim_device_t* dev;
  size_t gran;
  range_array_t free_va;      /* free va_reserve ranges, sorted, coalesced */
  chunk_t* chunks;            /* mem_alloc chunks, sorted by start */
  size_t nchunks, cap_chunks;
  uint64_t chunk_top;         /* the next chunk ends here */
  uint64_t place_hint;        /* stash_sim_place_at: where mem_alloc places next (0: none) */
  ptrmap_t handles;           /* id -> handle_t* */
  ptrmap_t pages;             /* page address -> (piece id << 1) | accessible */
  ptrmap_t pieces;            /* piece id -> piece_t* */
  ptrmap_t events;            /* id -> sim_event_t* */
  slab_t handle_slab, event_slab, piece_slab;
  uint64_t next_piece;
  double cost_us;             /* modelled driver time of the calls so far (docs/driver-costs.md) */
  double cost_by[STASH_CALL_COUNT]; /* the same, per kind of call */
  sim_stream_t* streams;
  size_t nstreams, cap_streams;
  uint64_t next_handle, next_event;
  uint64_t calls[STASH_CALL_COUNT];
  uint64_t total_calls;
  uint64_t fail_at[STASH_CALL_COUNT + 1];        /* call count that fails; 0 = none */
  stash_status_t fail_at_status[STASH_CALL_COUNT + 1];
  double fail_p[STASH_CALL_COUNT + 1];
  stash_status_t fail_p_status[STASH_CALL_COUNT + 1];
  uint64_t rng;
  uint64_t injected;
  stash_sim_call_fn on_call; /* stash_sim_on_call */
  void* on_call_arg;
};

/* ---- Sorted range arrays ----------------------------------------------------------------- */

static size_t ra_find(const range_array_t* a, uint64_t addr) {
  /* index of the first range with start > addr */
  size_t lo = 0, hi = a->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (a->v[mid].start <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static bool ra_insert_at(range_array_t* a, size_t i, range_t r) {
  range_t* v = _stash_array_grow(a->v, &a->cap, a->n + 1, sizeof *v, 16);
  if (!v) return false;
  a->v = v;
  memmove(&a->v[i + 1], &a->v[i], (a->n - i) * sizeof *a->v);
  a->v[i] = r;
  a->n++;
  return true;
}

static void ra_remove_at(range_array_t* a, size_t i) {
  memmove(&a->v[i], &a->v[i + 1], (a->n - i - 1) * sizeof *a->v);
  a->n--;
}

/* The range containing [addr, addr+size), or NULL. */
static range_t* ra_containing(const range_array_t* a, uint64_t addr, uint64_t size) {
  size_t i = ra_find(a, addr);
  if (i == 0) return NULL;
  range_t* r = &a->v[i - 1];
  if (addr >= r->start && addr + size <= r->start + r->size) return r;
  return NULL;
}

static size_t ra_index_of(const range_array_t* a, uint64_t start) {
  size_t i = ra_find(a, start);
  if (i && a->v[i - 1].start == start) return i - 1;
  return SIZE_MAX;
}

/* ---- Address space ------------------------------------------------------------------------ */

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static stash_status_t va_take(stash_sim_t* s, uint64_t size, uint64_t* out) {
  for (size_t i = 0; i < s->free_va.n; i++) {
    range_t* r = &s->free_va.v[i];
    if (r->size >= size) {
      *out = r->start;
      r->start += size;
      r->size -= size;
      if (r->size == 0) ra_remove_at(&s->free_va, i);
      return STASH_OK;
    }
  }
  return stash_provider_error(STASH_ERR_OOM, "sim: out of virtual address space");
}

/* Return [start, start+size) to a sorted, coalesced free list. false if the list could not
 * grow (out of host memory): the range is then lost to the simulation, never reused. */
static bool ra_give(range_array_t* a, uint64_t start, uint64_t size) {
  size_t i = ra_find(a, start);
  bool merge_prev = i > 0 && a->v[i - 1].start + a->v[i - 1].size == start;
  bool merge_next = i < a->n && start + size == a->v[i].start;
  if (merge_prev && merge_next) {
    a->v[i - 1].size += size + a->v[i].size;
    ra_remove_at(a, i);
  } else if (merge_prev) {
    a->v[i - 1].size += size;
  } else if (merge_next) {
    a->v[i].start = start;
    a->v[i].size += size;
  } else {
    return ra_insert_at(a, i, (range_t){start, size});
  }
  return true;
}

static void va_give(stash_sim_t* s, uint64_t start, uint64_t size) {
  (void)ra_give(&s->free_va, start, size);
}

/* ---- The driver-like placement of plain allocations ------------------------------------------ */

static bool chunk_insert(stash_sim_t* s, chunk_t c) {
  chunk_t* v = _stash_array_grow(s->chunks, &s->cap_chunks, s->nchunks + 1, sizeof *v, 64);
  if (!v) return false;
  s->chunks = v;
  size_t i = 0;
  while (i < s->nchunks && s->chunks[i].start < c.start) i++;
  memmove(&s->chunks[i + 1], &s->chunks[i], (s->nchunks - i) * sizeof *s->chunks);
  s->chunks[i] = c;
  s->nchunks++;
  return true;
}

/* Carve [at, at+size) out of a chunk's free range `r` (index ri). */
static bool chunk_take(chunk_t* c, size_t ri, uint64_t size) {
  range_t* r = &c->free.v[ri];
  r->start += size;
  r->size -= size;
  if (r->size == 0) ra_remove_at(&c->free, ri);
  return true;
}

/* Place `size` bytes at the hinted address when nothing is there: a chunk of its own, wholly
 * taken, so that the driver-like placement never hands it out. */
static bool place_hinted(stash_sim_t* s, uint64_t size, uint64_t* out) {
  uint64_t at = s->place_hint;
  if (!at || at % s->gran || at + size < at) return false;
  if (at < SIM_VA_LIMIT && at + size > SIM_VA_BASE) return false;
  for (size_t k = 0; k < s->nchunks; k++) {
    const chunk_t* o = &s->chunks[k];
    if (at < o->start + o->size && o->start < at + size) return false;
  }
  chunk_t c = {.start = at, .size = size};
  if (!chunk_insert(s, c)) return false;
  *out = at;
  return true;
}

/* Place `size` bytes (a multiple of 2 MiB) as the driver does. */
static stash_status_t place_alloc(stash_sim_t* s, uint64_t size, uint64_t* out) {
  if (place_hinted(s, size, out)) return STASH_OK;
  chunk_t* best = NULL;
  size_t best_ri = 0;
  for (size_t k = 0; k < s->nchunks; k++) {
    chunk_t* c = &s->chunks[k];
    for (size_t ri = 0; ri < c->free.n; ri++) {
      if (c->free.v[ri].size >= size &&
          (!best || c->free.v[ri].start < best->free.v[best_ri].start)) {
        best = c;
        best_ri = ri;
      }
    }
    if (best) break; /* chunks are sorted and their ranges lie inside them */
  }
  if (best) {
    *out = best->free.v[best_ri].start;
    chunk_take(best, best_ri, size);
    return STASH_OK;
  }
  uint64_t csize = (size + SIM_CHUNK - 1) / SIM_CHUNK * SIM_CHUNK;
  if (csize < size || s->chunk_top < SIM_VA_LIMIT + csize)
    return stash_provider_error(STASH_ERR_OOM, "sim: out of address space");
  /* Below any chunk placed at a traced address (stash_sim_place_at) that is in the way. */
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t k = 0; k < s->nchunks; k++) {
      const chunk_t* o = &s->chunks[k];
      if (o->start < s->chunk_top && s->chunk_top - csize < o->start + o->size) {
        s->chunk_top = o->start;
        moved = true;
      }
    }
    if (s->chunk_top < SIM_VA_LIMIT + csize)
      return stash_provider_error(STASH_ERR_OOM, "sim: out of address space");
  }
  chunk_t c = {.start = s->chunk_top - csize, .size = csize};
  if (csize > size && !ra_insert_at(&c.free, 0, (range_t){c.start + size, csize - size}))
    return stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory");
  if (!chunk_insert(s, c)) {
    free(c.free.v);
    return stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory");
  }
  s->chunk_top = c.start;
  *out = c.start;
  return STASH_OK;
}

static void place_free(stash_sim_t* s, uint64_t ptr, uint64_t size) {
  for (size_t k = 0; k < s->nchunks; k++) {
    chunk_t* c = &s->chunks[k];
    if (ptr < c->start || ptr >= c->start + c->size) continue;
    range_array_t* a = &c->free;
    if (!ra_give(a, ptr, size)) return;
    if (a->n == 1 && a->v[0].start == c->start && a->v[0].size == c->size) {
      free(a->v); /* all free: release the chunk */
      memmove(c, c + 1, (s->nchunks - k - 1) * sizeof *c);
      s->nchunks--;
    }
    return;
  }
}

/* The ranges the driver has already set up when a process starts. */
static bool place_init(stash_sim_t* s) {
  const uint64_t base = SIM_ALLOC_BASE, M = 1ULL << 20;
  chunk_t first = {.start = base, .size = 2 * M};
  chunk_t second = {.start = base + 74 * M, .size = 24 * M};
  if (!ra_insert_at(&first.free, 0, (range_t){first.start, first.size})) return false;
  if (!ra_insert_at(&second.free, 0, (range_t){second.start, second.size}) ||
      !chunk_insert(s, first) || !chunk_insert(s, second)) {
    free(first.free.v);
    free(second.free.v);
    return false;
  }
  s->chunk_top = base - 0x19e00000ULL;
  return true;
}

/* ---- The cost model: what each call costs on an H200 (data/traces/README.md) --------------- */

/* Piecewise linear in the size, through measured points (bytes, microseconds); beyond the
 * last point the last slope continues, below the first the first value holds. */
static double interp_us(uint64_t size, const double (*pts)[2], int n) {
  double x = (double)size;
  if (x <= pts[0][0]) return pts[0][1];
  for (int i = 1; i < n; i++) {
    if (x <= pts[i][0] || i == n - 1) {
      double t = (x - pts[i - 1][0]) / (pts[i][0] - pts[i - 1][0]);
      return pts[i - 1][1] + t * (pts[i][1] - pts[i - 1][1]);
    }
  }
  return pts[n - 1][1];
}

#define MIB_D 1048576.0
static const double k_alloc_us[][2] = {{2 * MIB_D, 31}, {20 * MIB_D, 36}, {512 * MIB_D, 61}};
static const double k_free_us[][2] = {{2 * MIB_D, 27}, {20 * MIB_D, 35}, {512 * MIB_D, 165}};
static const double k_create_us[][2] = {{2 * MIB_D, 7.3}, {512 * MIB_D, 13}};

/* The cost of cuMemSetAccess / cuMemUnmap over [va, va+size) made of k separately mapped
 * pieces of m_i MiB: sum(base + per_mib * m_i) + pair * k * (k - 1). Fitted to the H200
 * (tools/gpu/probe_access.txt: 18.7 us for one 2 MiB piece, 631 for 32 of them, 1262 for
 * 32 of 256 MiB; unmap 12.8, 416, 698) and to data/traces/README.md's 6900 and 4000 us
 * for 256 pieces of 2 MiB. Lock held. */
static double pieces_cost(const stash_sim_t* s, uint64_t va, uint64_t size, double base,
                          double per_mib, double pair) {
  uint64_t k = 0, prev = 0;
  double us = 0, mib = (double)s->gran / (1024.0 * 1024.0);
  for (uint64_t p = va; p < va + size; p += s->gran) {
    uint64_t piece = (uint64_t)(uintptr_t)_stash_ptrmap_get(&s->pages, p) >> 1;
    if (piece != prev) {
      k++;
      us += base;
    }
    us += per_mib * mib;
    prev = piece;
  }
  return us + pair * (double)k * (double)(k ? k - 1 : 0);
}

/* ---- Calls, counters and fault injection ------------------------------------------------ */

static uint64_t next_random(stash_sim_t* s) {
  uint64_t z = _stash_mix64(s->rng);
  s->rng += 0x9E3779B97F4A7C15ULL;
  return z;
}

/* Count a call; returns a status other than STASH_OK if it is to fail. Lock held. */
static stash_status_t enter(stash_sim_t* s, stash_provider_call_t call) {
  s->calls[call]++;
  s->total_calls++;
  stash_status_t fail = STASH_OK;
  if (s->fail_at[call] && s->calls[call] == s->fail_at[call]) {
    fail = s->fail_at_status[call];
    s->fail_at[call] = 0;
  } else if (s->fail_at[STASH_CALL_ANY] && s->total_calls == s->fail_at[STASH_CALL_ANY]) {
    fail = s->fail_at_status[STASH_CALL_ANY];
    s->fail_at[STASH_CALL_ANY] = 0;
  } else {
    for (int k = 0; k < 2 && fail == STASH_OK; k++) {
      int idx = k == 0 ? (int)call : STASH_CALL_ANY;
      if (s->fail_p[idx] > 0) {
        double u = (double)(next_random(s) >> 11) / (double)(1ULL << 53);
        if (u < s->fail_p[idx]) fail = s->fail_p_status[idx];
      }
    }
  }
  if (fail != STASH_OK) {
    s->injected++;
    return stash_provider_error(fail, "sim: injected failure of %s (call %" PRIu64 "): %s",
                                stash_provider_call_name(call), s->calls[call],
                                stash_status_text(fail));
  }
  return STASH_OK;
}

#define ENTER(s, call)                                    \
  do {                                                    \
    pthread_mutex_lock(&(s)->lock);                       \
    stash_status_t st_ = enter((s), STASH_CALL_##call);   \
    if (st_ != STASH_OK) {                                \
      pthread_mutex_unlock(&(s)->lock);                   \
      return st_;                                         \
    }                                                     \
  } while (0)

/* Charge a call that succeeded its modelled cost, and tell stash_sim_on_call's hook (`bytes`:
 * the size the call was about, 0 for none). */
#define COST(s, call, us, bytes)                                              \
  do {                                                                        \
    double us_ = (us);                                                        \
    (s)->cost_us += us_;                                                      \
    (s)->cost_by[STASH_CALL_##call] += us_;                                   \
    if ((s)->on_call) (s)->on_call((s)->on_call_arg, STASH_CALL_##call, (bytes), us_); \
  } while (0)

#define LEAVE(s, status)              \
  do {                                \
    stash_status_t r_ = (status);     \
    pthread_mutex_unlock(&(s)->lock); \
    return r_;                        \
  } while (0)

static stash_status_t bad_device(int device) {
  return stash_provider_error(STASH_ERR_INVALID, "sim: no device %d", device);
}

/* ---- The provider functions --------------------------------------------------------------- */

static stash_status_t sim_device_count(void* ctx, int* count) {
  *count = ((stash_sim_t*)ctx)->ndev;
  return STASH_OK;
}

static stash_status_t sim_granularity(void* ctx, int device, size_t* bytes) {
  stash_sim_t* s = ctx;
  if (device < 0 || device >= s->ndev) return bad_device(device);
  *bytes = s->gran;
  return STASH_OK;
}

static stash_status_t sim_mem_info(void* ctx, int device, size_t* free_bytes, size_t* total) {
  stash_sim_t* s = ctx;
  ENTER(s, mem_info);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  *free_bytes = s->dev[device].capacity - s->dev[device].used;
  *total = s->dev[device].capacity;
  COST(s, mem_info, 21.0, 0);
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_mem_alloc(void* ctx, int device, size_t size, uint64_t* ptr) {
  stash_sim_t* s = ctx;
  ENTER(s, mem_alloc);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  if (size == 0) LEAVE(s, stash_provider_error(STASH_ERR_INVALID, "sim: mem_alloc of 0 bytes"));
  sim_device_t* d = &s->dev[device];
  uint64_t need = round_up(size, s->gran);
  if (need < size || need > d->capacity - d->used)
    LEAVE(s, stash_provider_error(STASH_ERR_OOM, "sim: out of memory allocating %zu bytes",
                                  size));
  uint64_t va = 0;
  stash_status_t st = place_alloc(s, need, &va);
  if (st != STASH_OK) LEAVE(s, st);
  size_t i = ra_find(&d->allocs, va);
  if (!ra_insert_at(&d->allocs, i, (range_t){va, size})) {
    place_free(s, va, need);
    LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
  }
  d->used += need;
  COST(s, mem_alloc, interp_us(size, k_alloc_us, 3), size);
  *ptr = va;
  LEAVE(s, STASH_OK);
}

/* Every stream's work queued so far has completed (and so every wait is over). Lock held. */
static void complete_all(stash_sim_t* s) {
  for (size_t i = 0; i < s->nstreams; i++) {
    s->streams[i].done_point = 2 * s->streams[i].recorded + 1;
    s->streams[i].nwaits = 0;
  }
}

static stash_status_t sim_mem_free(void* ctx, int device, uint64_t ptr, size_t size) {
  stash_sim_t* s = ctx;
  ENTER(s, mem_free);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  sim_device_t* d = &s->dev[device];
  size_t i = ra_index_of(&d->allocs, ptr);
  if (i == SIZE_MAX)
    LEAVE(s, stash_provider_error(STASH_ERR_DRIVER,
                                  "sim: mem_free of 0x%" PRIx64 ", not an allocation", ptr));
  if (d->allocs.v[i].size != size)
    LEAVE(s, stash_provider_error(STASH_ERR_DRIVER,
                                  "sim: mem_free of 0x%" PRIx64 " with size %zu, allocated %" PRIu64,
                                  ptr, size, d->allocs.v[i].size));
  uint64_t need = round_up(size, s->gran);
  ra_remove_at(&d->allocs, i);
  place_free(s, ptr, need);
  d->used -= need;
  /* cuMemFree synchronizes: it returns once the work queued on every stream is done (the
   * CUDA documentation: "synchronous behavior for most use cases"; PyTorch frees a segment
   * that other streams' work used on that ground, and so does policy:pytorch) */
  complete_all(s);
  COST(s, mem_free, interp_us(size, k_free_us, 3), size);
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_va_reserve(void* ctx, int device, size_t size, uint64_t* va) {
  stash_sim_t* s = ctx;
  ENTER(s, va_reserve);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  if (size == 0 || size % s->gran)
    LEAVE(s, stash_provider_error(STASH_ERR_INVALID, "sim: va_reserve of %zu bytes", size));
  uint64_t start = 0;
  stash_status_t st = va_take(s, size, &start);
  if (st != STASH_OK) LEAVE(s, st);
  sim_device_t* d = &s->dev[device];
  if (!ra_insert_at(&d->reservations, ra_find(&d->reservations, start), (range_t){start, size})) {
    va_give(s, start, size);
    LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
  }
  COST(s, va_reserve, 1.0, size); /* cuMemAddressReserve: 0.4-1.9 us */
  *va = start;
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_va_free(void* ctx, int device, uint64_t va, size_t size) {
  stash_sim_t* s = ctx;
  ENTER(s, va_free);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  sim_device_t* d = &s->dev[device];
  size_t i = ra_index_of(&d->reservations, va);
  if (i == SIZE_MAX || d->reservations.v[i].size != size)
    LEAVE(s, stash_provider_error(STASH_ERR_DRIVER,
                                  "sim: va_free of 0x%" PRIx64 "+%zu, not a reservation", va, size));
  if (d->pages) {
    for (uint64_t p = va; p < va + size; p += s->gran) {
      if (_stash_ptrmap_get(&s->pages, p))
        LEAVE(s, stash_provider_error(STASH_ERR_DRIVER,
                                      "sim: va_free of a range with page 0x%" PRIx64 " mapped", p));
    }
  }
  ra_remove_at(&d->reservations, i);
  va_give(s, va, size);
  COST(s, va_free, 1.0, size); /* cuMemAddressFree: not measured, taken as cuMemAddressReserve */
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_phys_create(void* ctx, int device, size_t size, uint64_t* handle) {
  stash_sim_t* s = ctx;
  ENTER(s, phys_create);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  if (size == 0 || size % s->gran)
    LEAVE(s, stash_provider_error(STASH_ERR_INVALID, "sim: phys_create of %zu bytes", size));
  sim_device_t* d = &s->dev[device];
  if (size > d->capacity - d->used)
    LEAVE(s, stash_provider_error(STASH_ERR_OOM, "sim: out of memory creating %zu bytes", size));
  handle_t* h = _stash_slab_alloc(&s->handle_slab);
  uint64_t id = s->next_handle + 1;
  if (!h || _stash_ptrmap_put(&s->handles, id, h) != STASH_OK) {
    if (h) _stash_slab_free(&s->handle_slab, h);
    LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
  }
  s->next_handle = id;
  h->size = size;
  h->device = device;
  d->used += size;
  d->handles++;
  COST(s, phys_create, interp_us(size, k_create_us, 2), size);
  *handle = id;
  LEAVE(s, STASH_OK);
}

static void handle_drop(stash_sim_t* s, uint64_t id, handle_t* h) {
  s->dev[h->device].used -= h->size;
  _stash_ptrmap_take(&s->handles, id);
  _stash_slab_free(&s->handle_slab, h);
}

static stash_status_t sim_phys_release(void* ctx, int device, uint64_t id) {
  stash_sim_t* s = ctx;
  ENTER(s, phys_release);
  handle_t* h = _stash_ptrmap_get(&s->handles, id);
  if (!h || h->released || h->device != device)
    LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: phys_release of unknown handle %" PRIu64,
                                  id));
  h->released = true;
  s->dev[device].handles--;
  size_t size = h->size;
  if (h->maps == 0) handle_drop(s, id, h);
  COST(s, phys_release, 9.3, size);
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_map(void* ctx, int device, uint64_t va, size_t size, uint64_t id,
                              size_t offset) {
  stash_sim_t* s = ctx;
  ENTER(s, map);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  handle_t* h = _stash_ptrmap_get(&s->handles, id);
  if (!h || h->released)
    LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: map of unknown handle %" PRIu64, id));
  if (size == 0 || offset > h->size || size > h->size - offset || va % s->gran ||
      size % s->gran || offset % s->gran)
    LEAVE(s, stash_provider_error(STASH_ERR_INVALID,
                                  "sim: map of %zu bytes at offset %zu of a handle of %zu to 0x%" PRIx64,
                                  size, offset, h->size, va));
  /* As the driver (CUDA 13 on an H200, tools/gpu/probe_map.txt): only whole allocations. */
  if (offset != 0 || size != h->size)
    LEAVE(s, stash_provider_error(STASH_ERR_DRIVER,
                                  "sim: map of %zu bytes at offset %zu of a physical allocation of "
                                  "%zu: the driver maps whole allocations only "
                                  "(CUDA_ERROR_NOT_SUPPORTED)", size, offset, h->size));
  sim_device_t* d = &s->dev[device];
  if (!ra_containing(&d->reservations, va, size))
    LEAVE(s, stash_provider_error(STASH_ERR_DRIVER,
                                  "sim: map at 0x%" PRIx64 "+%zu outside any reservation", va, size));
  for (uint64_t p = va; p < va + size; p += s->gran) {
    if (_stash_ptrmap_get(&s->pages, p))
      LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: map over mapped page 0x%" PRIx64, p));
  }
  piece_t* pc = _stash_slab_alloc(&s->piece_slab);
  uint64_t pid = s->next_piece + 1;
  if (!pc || _stash_ptrmap_reserve(&s->pages, size / s->gran) != STASH_OK ||
      _stash_ptrmap_put(&s->pieces, pid, pc) != STASH_OK) {
    if (pc) _stash_slab_free(&s->piece_slab, pc);
    LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
  }
  s->next_piece = pid;
  pc->handle = id;
  pc->va = va;
  pc->offset = offset;
  for (uint64_t p = va; p < va + size; p += s->gran) {
    _stash_ptrmap_put(&s->pages, p, (void*)(uintptr_t)(pid << 1));
    pc->pages++;
    h->maps++;
    d->pages++;
  }
  COST(s, map, 0.6, size);
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_unmap(void* ctx, int device, uint64_t va, size_t size) {
  stash_sim_t* s = ctx;
  ENTER(s, unmap);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  if (va % s->gran || size % s->gran || size == 0)
    LEAVE(s, stash_provider_error(STASH_ERR_INVALID, "sim: unmap of unaligned range"));
  for (uint64_t p = va; p < va + size; p += s->gran) {
    uint64_t v = (uint64_t)(uintptr_t)_stash_ptrmap_get(&s->pages, p);
    if (!v)
      LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: unmap of unmapped page 0x%" PRIx64, p));
    /* As the driver: a mapping is unmapped whole (CUDA_ERROR_INVALID_VALUE otherwise). */
    piece_t* pc = _stash_ptrmap_get(&s->pieces, v >> 1);
    handle_t* hd = pc ? _stash_ptrmap_get(&s->handles, pc->handle) : NULL;
    if (pc && hd && (pc->va < va || pc->va + hd->size > va + size))
      LEAVE(s, stash_provider_error(STASH_ERR_INVALID,
                                    "sim: unmap of part of a mapping at 0x%" PRIx64
                                    " (the driver unmaps whole mappings only)", pc->va));
  }
  COST(s, unmap, pieces_cost(s, va, size, 12.5, 0.035, 0.012), size);
  for (uint64_t p = va; p < va + size; p += s->gran) {
    uint64_t pid = (uint64_t)(uintptr_t)_stash_ptrmap_take(&s->pages, p) >> 1;
    piece_t* pc = _stash_ptrmap_get(&s->pieces, pid);
    uint64_t id = pc ? pc->handle : 0;
    if (pc && --pc->pages == 0) {
      _stash_ptrmap_take(&s->pieces, pid);
      _stash_slab_free(&s->piece_slab, pc);
    }
    handle_t* h = _stash_ptrmap_get(&s->handles, id);
    s->dev[device].pages--;
    if (h && --h->maps == 0 && h->released) handle_drop(s, id, h);
  }
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_set_access(void* ctx, int device, uint64_t va, size_t size) {
  stash_sim_t* s = ctx;
  ENTER(s, set_access);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  for (uint64_t p = va; p < va + size; p += s->gran) {
    if (!_stash_ptrmap_get(&s->pages, p))
      LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: set_access on unmapped page 0x%" PRIx64,
                                    p));
  }
  COST(s, set_access, pieces_cost(s, va, size, 18.5, 0.07, 0.033), size);
  for (uint64_t p = va; p < va + size; p += s->gran) {
    uint64_t v = (uint64_t)(uintptr_t)_stash_ptrmap_get(&s->pages, p);
    _stash_ptrmap_put(&s->pages, p, (void*)(uintptr_t)(v | 1));
  }
  LEAVE(s, STASH_OK);
}

static int stream_index(stash_sim_t* s, void* stream) {
  for (size_t i = 0; i < s->nstreams; i++) {
    if (s->streams[i].stream == stream) return (int)i;
  }
  sim_stream_t* v =
      _stash_array_grow(s->streams, &s->cap_streams, s->nstreams + 1, sizeof *v, 8);
  if (!v) return -1;
  s->streams = v;
  s->streams[s->nstreams] = (sim_stream_t){.stream = stream};
  return (int)s->nstreams++;
}

static stash_status_t sim_event_create(void* ctx, int device, uint64_t* event) {
  stash_sim_t* s = ctx;
  ENTER(s, event_create);
  if (device < 0 || device >= s->ndev) LEAVE(s, bad_device(device));
  sim_event_t* e = _stash_slab_alloc(&s->event_slab);
  uint64_t id = s->next_event + 1;
  if (!e || _stash_ptrmap_put(&s->events, id, e) != STASH_OK) {
    if (e) _stash_slab_free(&s->event_slab, e);
    LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
  }
  s->next_event = id;
  e->device = device;
  e->stream = -1;
  s->dev[device].events++;
  COST(s, event_create, 0.31, 0);
  *event = id;
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_event_record(void* ctx, int device, uint64_t event, void* stream) {
  stash_sim_t* s = ctx;
  (void)device;
  ENTER(s, event_record);
  sim_event_t* e = _stash_ptrmap_get(&s->events, event);
  if (!e) LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: unknown event %" PRIu64, event));
  int si = stream_index(s, stream);
  if (si < 0) LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
  e->stream = si;
  e->seq = ++s->streams[si].recorded;
  COST(s, event_record, 0.20, 0);
  LEAVE(s, STASH_OK);
}

/* Stream si's work up to `point` has completed (2k: up to its k-th event; 2k + 1: all it had
 * queued before its (k+1)-th: stash_sim_stream_point) - and so has the work that work waited
 * for (stream_wait): the events of other streams it waited for, and theirs in turn. A wait
 * queued after the stream's k-th event is part of its work from 2k + 1 on. */
static void complete_to(stash_sim_t* s, int si, uint64_t point) {
  sim_stream_t* st = &s->streams[si];
  if (point > st->done_point) st->done_point = point;
  for (size_t i = 0; i < st->nwaits;) {
    sim_wait_t w = st->waits[i];
    if (2 * w.after >= point) { /* queued after that point: not known to be done */
      i++;
      continue;
    }
    st->waits[i] = st->waits[--st->nwaits]; /* out first: a cycle of waits ends */
    complete_to(s, w.stream, 2 * w.seq);
    st = &s->streams[si];
  }
}

/* All the work queued so far on stream si. */
static void complete_queued(stash_sim_t* s, int si) {
  complete_to(s, si, 2 * s->streams[si].recorded + 1);
}

static bool event_done(const stash_sim_t* s, const sim_event_t* e) {
  return e->stream < 0 || s->streams[e->stream].done_point >= 2 * e->seq;
}

static stash_status_t sim_event_query(void* ctx, uint64_t event) {
  stash_sim_t* s = ctx;
  ENTER(s, event_query);
  sim_event_t* e = _stash_ptrmap_get(&s->events, event);
  if (!e) LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: unknown event %" PRIu64, event));
  COST(s, event_query, 0.19, 0);
  LEAVE(s, event_done(s, e) ? STASH_OK : STASH_ERR_NOT_READY);
}

static stash_status_t sim_event_synchronize(void* ctx, uint64_t event) {
  stash_sim_t* s = ctx;
  ENTER(s, event_synchronize);
  sim_event_t* e = _stash_ptrmap_get(&s->events, event);
  if (!e) LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: unknown event %" PRIu64, event));
  /* Waiting lets the stream run up to the event. */
  if (!event_done(s, e)) complete_to(s, e->stream, 2 * e->seq);
  COST(s, event_synchronize, 0.19, 0); /* not measured: taken as cuEventQuery, the wait itself not counted */
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_event_destroy(void* ctx, uint64_t event) {
  stash_sim_t* s = ctx;
  ENTER(s, event_destroy);
  sim_event_t* e = _stash_ptrmap_take(&s->events, event);
  if (!e) LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: unknown event %" PRIu64, event));
  s->dev[e->device].events--;
  _stash_slab_free(&s->event_slab, e);
  COST(s, event_destroy, 0.12, 0);
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_stream_synchronize(void* ctx, int device, void* stream) {
  stash_sim_t* s = ctx;
  (void)device;
  ENTER(s, stream_synchronize);
  int si = stream_index(s, stream);
  if (si < 0) LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
  complete_queued(s, si);
  COST(s, stream_synchronize, 3.0, 0); /* not measured: an idle stream's synchronize, a few us */
  LEAVE(s, STASH_OK);
}

static stash_status_t sim_stream_wait(void* ctx, int device, void* stream, uint64_t event) {
  stash_sim_t* s = ctx;
  (void)device;
  ENTER(s, stream_wait);
  sim_event_t* e = _stash_ptrmap_get(&s->events, event);
  if (!e) LEAVE(s, stash_provider_error(STASH_ERR_DRIVER, "sim: unknown event %" PRIu64, event));
  int si = stream_index(s, stream);
  if (si < 0) LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
  if (!event_done(s, e) && e->stream != si) { /* a done event (or never recorded): no wait */
    sim_stream_t* st = &s->streams[si];
    sim_wait_t* v = _stash_array_grow(st->waits, &st->cap_waits, st->nwaits + 1, sizeof *v, 4);
    if (!v) LEAVE(s, stash_provider_error(STASH_ERR_HOST_OOM, "sim: out of host memory"));
    st->waits = v;
    st->waits[st->nwaits++] = (sim_wait_t){st->recorded, e->stream, e->seq};
  }
  COST(s, stream_wait, SIM_STREAM_WAIT_US, 0);
  LEAVE(s, STASH_OK);
}

/* ---- Public control API --------------------------------------------------------------------- */

stash_status_t stash_sim_create(int devices, size_t capacity, stash_sim_t** out) {
  if (!out) return _stash_error(STASH_ERR_INVALID, "stash_sim_create: out is NULL");
  *out = NULL;
  if (devices < 1 || devices > 1024)
    return _stash_error(STASH_ERR_INVALID, "stash_sim_create: %d devices (1..1024)", devices);
  if (capacity == 0) capacity = STASH_SIM_DEFAULT_CAPACITY;
  stash_sim_t* s = calloc(1, sizeof *s);
  if (!s) return _stash_error(STASH_ERR_HOST_OOM, "stash_sim_create: out of host memory");
  s->dev = calloc((size_t)devices, sizeof *s->dev);
  if (!s->dev || !ra_insert_at(&s->free_va, 0, (range_t){SIM_VA_BASE, SIM_VA_LIMIT - SIM_VA_BASE}) ||
      !place_init(s)) {
    for (size_t k = 0; k < s->nchunks; k++) free(s->chunks[k].free.v);
    free(s->chunks);
    free(s->free_va.v);
    free(s->dev);
    free(s);
    return _stash_error(STASH_ERR_HOST_OOM, "stash_sim_create: out of host memory");
  }
  pthread_mutex_init(&s->lock, NULL);
  s->ndev = devices;
  s->gran = STASH_SIM_DEFAULT_GRANULARITY;
  for (int i = 0; i < devices; i++) s->dev[i].capacity = capacity;
  _stash_ptrmap_init(&s->handles);
  _stash_ptrmap_init(&s->pages);
  _stash_ptrmap_init(&s->pieces);
  _stash_ptrmap_init(&s->events);
  _stash_slab_init(&s->piece_slab, sizeof(piece_t));
  _stash_slab_init(&s->handle_slab, sizeof(handle_t));
  _stash_slab_init(&s->event_slab, sizeof(sim_event_t));
  stash_provider_t* t = &s->table;
  t->version = STASH_PROVIDER_VERSION;
  t->size = sizeof *t;
  t->name = "sim";
  t->ctx = s;
  t->device_count = sim_device_count;
  t->granularity = sim_granularity;
  t->mem_info = sim_mem_info;
  t->mem_alloc = sim_mem_alloc;
  t->mem_free = sim_mem_free;
  t->va_reserve = sim_va_reserve;
  t->va_free = sim_va_free;
  t->phys_create = sim_phys_create;
  t->phys_release = sim_phys_release;
  t->map = sim_map;
  t->unmap = sim_unmap;
  t->set_access = sim_set_access;
  t->event_create = sim_event_create;
  t->event_record = sim_event_record;
  t->event_query = sim_event_query;
  t->event_synchronize = sim_event_synchronize;
  t->event_destroy = sim_event_destroy;
  t->stream_synchronize = sim_stream_synchronize;
  t->stream_wait = sim_stream_wait;
  *out = s;
  return STASH_OK;
}

void stash_sim_destroy(stash_sim_t* s) {
  if (!s) return;
  for (int i = 0; i < s->ndev; i++) {
    free(s->dev[i].allocs.v);
    free(s->dev[i].reservations.v);
  }
  free(s->dev);
  free(s->free_va.v);
  for (size_t k = 0; k < s->nchunks; k++) free(s->chunks[k].free.v);
  free(s->chunks);
  for (size_t i = 0; i < s->nstreams; i++) free(s->streams[i].waits);
  free(s->streams);
  _stash_ptrmap_free(&s->handles);
  _stash_ptrmap_free(&s->pages);
  _stash_ptrmap_free(&s->pieces);
  _stash_ptrmap_free(&s->events);
  _stash_slab_destroy(&s->piece_slab);
  _stash_slab_destroy(&s->handle_slab);
  _stash_slab_destroy(&s->event_slab);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

const stash_provider_t* stash_sim_provider(stash_sim_t* s) { return &s->table; }

void stash_sim_complete(stash_sim_t* s, void* stream) {
  pthread_mutex_lock(&s->lock);
  int si = stream_index(s, stream);
  if (si >= 0) complete_queued(s, si);
  pthread_mutex_unlock(&s->lock);
}

void stash_sim_complete_to(stash_sim_t* s, void* stream, uint64_t point) {
  pthread_mutex_lock(&s->lock);
  int si = stream_index(s, stream);
  if (si >= 0 && point) {
    uint64_t queued = 2 * s->streams[si].recorded + 1;
    complete_to(s, si, point < queued ? point : queued);
  }
  pthread_mutex_unlock(&s->lock);
}

void stash_sim_complete_all(stash_sim_t* s) {
  pthread_mutex_lock(&s->lock);
  complete_all(s);
  pthread_mutex_unlock(&s->lock);
}

uint64_t stash_sim_stream_point(stash_sim_t* s, void* stream) {
  pthread_mutex_lock(&s->lock);
  int si = stream_index(s, stream);
  uint64_t point = si >= 0 ? 2 * s->streams[si].recorded + 1 : 0;
  pthread_mutex_unlock(&s->lock);
  return point;
}

/* Whether stream xi's work up to point xp (2k: up to its k-th event; UINT64_MAX: all of it,
 * queued now or later) runs after stream si's work up to `point`: it is that work, or it
 * waits - itself, or through the streams it waits for, in turn - for an event si recorded
 * after it. `depth` bounds the search (a chain visits each stream once at most). */
static bool runs_after(const stash_sim_t* s, int xi, uint64_t xp, int si, uint64_t point,
                       size_t depth) {
  if (xi == si) return xp >= point;
  if (depth > s->nstreams) return false;
  const sim_stream_t* x = &s->streams[xi];
  for (size_t i = 0; i < x->nwaits; i++) {
    const sim_wait_t* w = &x->waits[i];
    if (xp != UINT64_MAX && 2 * w->after >= xp) continue; /* queued after that point */
    if (runs_after(s, w->stream, 2 * w->seq, si, point, depth + 1)) return true;
  }
  return false;
}

bool stash_sim_ordered_after(stash_sim_t* s, void* stream, uint64_t point, void* later) {
  if (stream == later) return true;
  pthread_mutex_lock(&s->lock);
  int si = stream_index(s, stream), li = stream_index(s, later);
  bool ordered = si >= 0 && (s->streams[si].done_point >= point ||
                             (li >= 0 && runs_after(s, li, UINT64_MAX, si, point, 0)));
  pthread_mutex_unlock(&s->lock);
  return ordered;
}

void stash_sim_place_at(stash_sim_t* sim, uint64_t addr) {
  pthread_mutex_lock(&sim->lock);
  sim->place_hint = addr;
  pthread_mutex_unlock(&sim->lock);
}

uint64_t stash_sim_calls(const stash_sim_t* cs, stash_provider_call_t call) {
  stash_sim_t* s = (stash_sim_t*)cs;
  pthread_mutex_lock(&s->lock);
  uint64_t v = call == STASH_CALL_ANY ? s->total_calls : (call < STASH_CALL_COUNT ? s->calls[call] : 0);
  pthread_mutex_unlock(&s->lock);
  return v;
}

void stash_sim_reset_calls(stash_sim_t* s) {
  pthread_mutex_lock(&s->lock);
  /* Pending nth-failures stay aimed at the same future call. */
  for (int k = 0; k < STASH_CALL_COUNT; k++) {
    if (s->fail_at[k]) s->fail_at[k] -= s->calls[k];
    s->calls[k] = 0;
  }
  if (s->fail_at[STASH_CALL_ANY]) s->fail_at[STASH_CALL_ANY] -= s->total_calls;
  s->total_calls = 0;
  pthread_mutex_unlock(&s->lock);
}

void stash_sim_fail_nth(stash_sim_t* s, stash_provider_call_t call, uint64_t n,
                        stash_status_t status) {
  if (call > STASH_CALL_ANY) return;
  pthread_mutex_lock(&s->lock);
  uint64_t base = call == STASH_CALL_ANY ? s->total_calls : s->calls[call];
  s->fail_at[call] = n ? base + n : 0;
  s->fail_at_status[call] = status;
  pthread_mutex_unlock(&s->lock);
}

void stash_sim_fail_random(stash_sim_t* s, stash_provider_call_t call, double p, uint64_t seed,
                           stash_status_t status) {
  if (call > STASH_CALL_ANY) return;
  pthread_mutex_lock(&s->lock);
  s->fail_p[call] = p > 0 ? p : 0;
  s->fail_p_status[call] = status;
  s->rng = seed;
  pthread_mutex_unlock(&s->lock);
}

double stash_sim_modeled_us(const stash_sim_t* cs) {
  stash_sim_t* s = (stash_sim_t*)cs;
  pthread_mutex_lock(&s->lock);
  double v = s->cost_us;
  pthread_mutex_unlock(&s->lock);
  return v;
}

void stash_sim_on_call(stash_sim_t* s, stash_sim_call_fn fn, void* arg) {
  pthread_mutex_lock(&s->lock);
  s->on_call = fn;
  s->on_call_arg = fn ? arg : NULL;
  pthread_mutex_unlock(&s->lock);
}

double stash_sim_modeled_us_of(const stash_sim_t* cs, stash_provider_call_t call) {
  if (call == STASH_CALL_ANY) return stash_sim_modeled_us(cs);
  if ((int)call < 0 || call >= STASH_CALL_COUNT) return 0.0;
  stash_sim_t* s = (stash_sim_t*)cs;
  pthread_mutex_lock(&s->lock);
  double v = s->cost_by[call];
  pthread_mutex_unlock(&s->lock);
  return v;
}

uint64_t stash_sim_injected(const stash_sim_t* cs) {
  stash_sim_t* s = (stash_sim_t*)cs;
  pthread_mutex_lock(&s->lock);
  uint64_t v = s->injected;
  pthread_mutex_unlock(&s->lock);
  return v;
}

void stash_sim_usage(const stash_sim_t* cs, int device, stash_sim_usage_t* out) {
  stash_sim_t* s = (stash_sim_t*)cs;
  memset(out, 0, sizeof *out);
  if (device < 0 || device >= s->ndev) return;
  pthread_mutex_lock(&s->lock);
  sim_device_t* d = &s->dev[device];
  out->used_bytes = d->used;
  out->allocations = d->allocs.n;
  out->reservations = d->reservations.n;
  out->handles = d->handles;
  out->mapped_pages = d->pages;
  out->events = d->events;
  pthread_mutex_unlock(&s->lock);
}

bool stash_sim_is_usable(const stash_sim_t* cs, int device, uint64_t ptr, size_t size) {
  stash_sim_t* s = (stash_sim_t*)cs;
  if (device < 0 || device >= s->ndev || size == 0) return false;
  pthread_mutex_lock(&s->lock);
  bool ok = ra_containing(&s->dev[device].allocs, ptr, size) != NULL;
  if (!ok && ra_containing(&s->dev[device].reservations, ptr, size)) {
    ok = true;
    for (uint64_t p = ptr / s->gran * s->gran; p < ptr + size; p += s->gran) {
      uint64_t v = (uint64_t)(uintptr_t)_stash_ptrmap_get(&s->pages, p);
      if (!(v & 1)) {
        ok = false;
        break;
      }
    }
  }
  pthread_mutex_unlock(&s->lock);
  return ok;
}

size_t stash_sim_translate(const stash_sim_t* cs, int device, uint64_t ptr, size_t size,
                           uint64_t* phys) {
  stash_sim_t* s = (stash_sim_t*)cs;
  if (device < 0 || device >= s->ndev || size == 0) return 0;
  pthread_mutex_lock(&s->lock);
  size_t run = 0;
  range_t* r = ra_containing(&s->dev[device].allocs, ptr, 1);
  if (r) {
    *phys = (uint64_t)1 << 63 | ptr;
    uint64_t end = r->start + r->size;
    run = end - ptr < size ? (size_t)(end - ptr) : size;
  } else {
    uint64_t page = ptr / s->gran * s->gran;
    uint64_t v = (uint64_t)(uintptr_t)_stash_ptrmap_get(&s->pages, page);
    piece_t* pc = (v & 1) ? _stash_ptrmap_get(&s->pieces, v >> 1) : NULL;
    if (pc) {
      *phys = pc->handle << 40 | (pc->offset + (ptr - pc->va));
      /* Following pages of the same map call continue the same physical memory. */
      uint64_t p = page + s->gran;
      while (p < ptr + size && (uint64_t)(uintptr_t)_stash_ptrmap_get(&s->pages, p) == v)
        p += s->gran;
      run = p - ptr < size ? (size_t)(p - ptr) : size;
    }
  }
  pthread_mutex_unlock(&s->lock);
  return run;
}
