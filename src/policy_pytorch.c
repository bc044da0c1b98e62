/* policy_pytorch.c: PyTorch 2.11's native CUDA caching allocator, rule for rule.
 *
 * This file is c10/cuda/CUDACachingAllocator.cpp's DeviceCachingAllocator rebuilt in C,
 * decision for decision, so that a replayed trace reserves exactly what PyTorch reserves:
 *  - sizes rounded to 512 B (or to power-of-2 divisions); requests <= 1 MiB in the small
 *    pool (2 MiB segments), larger ones in the large pool (20 MiB segments below 10 MiB,
 *    else rounded up to 2 MiB);
 *  - best fit from a set ordered by (stream, size, address): free memory is never shared
 *    between streams;
 *  - the split rules, coalescing with free neighbours, oversize blocks (max_split_size);
 *  - blocks used on other streams wait for events before they are reused;
 *  - on a miss: garbage collection (with a memory fraction), a new segment, freeing
 *    oversize blocks, freeing every cached segment and retrying, then out of memory;
 *  - expandable segments: pages mapped into one large reserved range per (stream, pool).
 * PyTorch's CUDA-graph private pools are not implemented.
 *
 * Unlike PyTorch, every provider failure is handled: the call returns the error and the
 * heap stays consistent (stash_heap_check), with nothing leaked.
 *
 * Synchronization: every function here runs under the heap's lock (heap.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define kMinBlockSize ((size_t)512)
#define kSmallSize ((size_t)1 << 20)
#define kSmallBuffer ((size_t)2 << 20)
#define kMinLargeAlloc ((size_t)10 << 20)
#define kRoundLarge ((size_t)2 << 20)

typedef struct pt_block_s pt_block;
typedef struct pt_pool_s pt_pool;
typedef struct pt_seg_s pt_seg;

enum { IN_NONE = 0, IN_BLOCKS = 1, IN_UNMAPPED = 2 };

struct pt_pool_s {
  blockset_t blocks;   /* free, mapped blocks, by (stream, size, address) */
  blockset_t unmapped; /* unmapped ranges of expandable segments, by (stream, address) */
  bool is_small;
  int64_t get_free_blocks_call_count; /* the garbage collector's clock */
};

struct pt_seg_s {
  pt_seg* prev_seg; /* all segments of the heap, newest first */
  pt_seg* next_seg;
  pt_block* head;   /* the block at the segment's lowest address */
  uint64_t base;
  size_t size;      /* bytes of the allocation (expandable: of the reserved range) */
  pt_pool* pool;
  void* stream;
  bool expandable;
  /* Expandable segments only (PyTorch's ExpandableSegment). */
  size_t page;      /* segment_size_: 2 MiB (small pool) or large_segment_size */
  size_t max_pages; /* max_handles_ */
  uint64_t* handles;/* per page: physical handle, 0 when unmapped */
  size_t nhandles;  /* handles_.size(), trimmed of trailing empty pages */
  size_t cap_handles;
};

struct pt_block_s {
  bs_node_t node;   /* in pool->blocks or pool->unmapped (see where) */
  uint64_t ptr;
  size_t size;
  size_t requested_size;
  void* stream;     /* allocation stream */
  pt_pool* pool;
  pt_seg* seg;
  pt_block* prev;   /* address-ordered neighbours in the segment */
  pt_block* next;
  void** uses;      /* stream_uses: other streams the block was used on */
  uint32_t nuses;
  uint32_t cap_uses;
  int event_count;  /* outstanding events before the block can be reused */
  int64_t gc_count_base;
  bool allocated;
  bool mapped;
  uint8_t where;
};


typedef struct pt_state_s {
  pt_pool large;
  pt_pool small;
  slab_t block_slab;
  slab_t seg_slab;
  ptrmap_t allocated; /* address -> allocated block */
  pt_seg* segs;
  stash_events_t events; /* PyTorch's cuda_events and its event pool */
  stash_zombies_t zombies; /* pages whose unmap or release failed, retried later */
} pt_state;

typedef struct alloc_params_s {
  size_t size;       /* rounded request */
  void* stream;
  pt_pool* pool;
  size_t alloc_size; /* segment size on a miss */
  bool expandable_active;
  pt_block* block;
  stash_status_t err;
} alloc_params;

static inline pt_state* S(stash_heap_t* h) { return (pt_state*)h->policy_state; }
static inline pt_block* B(bs_node_t* n) { return (pt_block*)n; }

/* ---- Provider calls: errors carry the provider's own message ----------------------------- */

#define prov_fail _stash_prov_fail
#define PCALL _STASH_PCALL

/* ---- Ordered sets --------------------------------------------------------------------- */

static int cmp_u(uintptr_t a, uintptr_t b) { return a < b ? -1 : a > b ? 1 : 0; }

static int cmp_size(const bs_node_t* a, const bs_node_t* b) {
  const pt_block* x = (const pt_block*)a;
  const pt_block* y = (const pt_block*)b;
  if (x->stream != y->stream) return cmp_u((uintptr_t)x->stream, (uintptr_t)y->stream);
  if (x->size != y->size) return x->size < y->size ? -1 : 1;
  return cmp_u(x->ptr, y->ptr);
}

static int cmp_addr(const bs_node_t* a, const bs_node_t* b) {
  const pt_block* x = (const pt_block*)a;
  const pt_block* y = (const pt_block*)b;
  if (x->stream != y->stream) return cmp_u((uintptr_t)x->stream, (uintptr_t)y->stream);
  return cmp_u(x->ptr, y->ptr);
}

/* The two orders as key fields (blockset.c compares them inline, the node at offset 0):
 * (stream, size, address) and (stream, address). */
_Static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8 && offsetof(pt_block, node) == 0,
               "64-bit keys from the node");
static void pool_sets_init(pt_pool* pool) {
  _stash_bs_init_keys(&pool->blocks, cmp_size, 3, (ptrdiff_t)offsetof(pt_block, stream),
                      (ptrdiff_t)offsetof(pt_block, size), (ptrdiff_t)offsetof(pt_block, ptr));
  _stash_bs_init_keys(&pool->unmapped, cmp_addr, 2, (ptrdiff_t)offsetof(pt_block, stream),
                      (ptrdiff_t)offsetof(pt_block, ptr), 0);
}

static void pool_insert_free(pt_pool* pool, pt_block* b) {
  b->gc_count_base = pool->get_free_blocks_call_count;
  _stash_bs_insert(&pool->blocks, &b->node);
  b->where = IN_BLOCKS;
}

static void pool_insert_unmapped(pt_pool* pool, pt_block* b) {
  _stash_bs_insert(&pool->unmapped, &b->node);
  b->where = IN_UNMAPPED;
}

static void pool_erase(pt_block* b) {
  if (b->where == IN_BLOCKS) _stash_bs_erase(&b->pool->blocks, &b->node);
  else if (b->where == IN_UNMAPPED) _stash_bs_erase(&b->pool->unmapped, &b->node);
  b->where = IN_NONE;
}

/* ---- Blocks and segments ---------------------------------------------------------------- */

static pt_block* block_new(pt_state* s) { return _stash_slab_alloc(&s->block_slab); }

static void block_delete(pt_state* s, pt_block* b) {
  free(b->uses);
  _stash_slab_free(&s->block_slab, b);
}

static bool is_split(const pt_block* b) { return b->prev || b->next; }
static bool is_expandable(const pt_block* b) { return b->seg->expandable; }

/* Put n in front of b in b's segment. */
static void link_before(pt_block* n, pt_block* b) {
  n->prev = b->prev;
  n->next = b;
  if (b->prev) b->prev->next = n;
  else b->seg->head = n;
  b->prev = n;
}

static void link_after(pt_block* n, pt_block* b) {
  n->prev = b;
  n->next = b->next;
  if (b->next) b->next->prev = n;
  b->next = n;
}

static void seg_link(pt_state* s, pt_seg* g) {
  g->prev_seg = NULL;
  g->next_seg = s->segs;
  if (s->segs) s->segs->prev_seg = g;
  s->segs = g;
}

static void seg_unlink(pt_state* s, pt_seg* g) {
  if (g->prev_seg) g->prev_seg->next_seg = g->next_seg;
  else s->segs = g->next_seg;
  if (g->next_seg) g->next_seg->prev_seg = g->prev_seg;
}

static void seg_delete(pt_state* s, pt_seg* g) {
  free(g->handles);
  _stash_slab_free(&s->seg_slab, g);
}

/* ---- Sizes ------------------------------------------------------------------------------ */

static size_t floor_log2(size_t v) { return (size_t)(63 - __builtin_clzll((unsigned long long)v)); }

static size_t roundup_power2_divisions(const stash_conf_t* c, size_t size) {
  /* Buckets start at 1 MiB: [0,2 MiB) is bucket 0, [2,4) bucket 1, ..., >= 32 GiB 15. */
  long idx = (long)floor_log2(size) - 20;
  if (idx < 0) idx = 0;
  if (idx > STASH_ROUNDUP_BUCKETS - 1) idx = STASH_ROUNDUP_BUCKETS - 1;
  return c->roundup_power2_divisions[idx];
}

static size_t roundup_power2_next_division(size_t size, size_t divisions) {
  if ((size & (size - 1)) == 0) return size;
  size_t floor2 = (size_t)1 << floor_log2(size);
  size_t step = floor2 >> floor_log2(divisions);
  if (step == 0) return floor2 << 1;
  size_t down = size & ~(step - 1);
  return down == size ? size : down + step;
}

static size_t round_size(const stash_conf_t* c, size_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  size_t d = roundup_power2_divisions(c, size);
  if (d > 1 && size > kMinBlockSize * d) return roundup_power2_next_division(size, d);
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

static size_t get_allocation_size(const stash_conf_t* c, size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return c->large_segment_size;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

static bool should_split(const stash_conf_t* c, const pt_block* b, size_t size,
                         bool expandable_active) {
  size_t remaining = b->size - size;
  if (b->pool->is_small || expandable_active) return remaining >= kMinBlockSize;
  return size < c->max_split_size && remaining > kSmallSize;
}

/* ---- Statistics helpers -------------------------------------------------------------------- */

static void stat_inc(stash_stat_t* a, const pt_pool* p, size_t n) {
  _stash_stat_array_inc(a, p->is_small, (int64_t)n);
}
static void stat_dec(stash_stat_t* a, const pt_pool* p, size_t n) {
  _stash_stat_array_dec(a, p->is_small, (int64_t)n);
}

/* ---- Merging --------------------------------------------------------------------------- */

/* Merge src into dst if src is free and has the same mapping; returns the bytes taken. */
static size_t try_merge_blocks(pt_state* s, pt_block* dst, pt_block* src) {
  if (!src || src->allocated || src->event_count > 0 || src->nuses > 0 ||
      dst->mapped != src->mapped)
    return 0;
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
    else dst->seg->head = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  size_t subsumed = src->size;
  dst->size += subsumed;
  pool_erase(src);
  block_delete(s, src);
  return subsumed;
}

/* PyTorch's free_block: return a block whose uses are over to its pool, merged. */
static void free_block(stash_heap_t* h, pt_block* b) {
  pt_state* s = S(h);
  _stash_history_add(h, STASH_TRACE_FREE_COMPLETED, b->ptr, b->requested_size, b->stream);
  size_t original_size = b->size;
  size_t requested = b->requested_size;
  pt_pool* pool = b->pool;
  int64_t net_blocks = 0, net_bytes = 0;
  pt_block* cands[2] = {b->prev, b->next};
  for (int i = 0; i < 2; i++) {
    size_t subsumed = try_merge_blocks(s, b, cands[i]);
    if (subsumed > 0) {
      net_blocks -= 1;
      net_bytes -= (int64_t)subsumed;
    }
  }
  pool_insert_free(pool, b);
  if (is_split(b)) {
    net_blocks += 1;
    net_bytes += (int64_t)b->size;
  }
  stash_stats_t* st = &h->stats;
  if (!is_expandable(b)) {
    if (net_blocks > 0) stat_inc(st->inactive_split, pool, (size_t)net_blocks);
    else if (net_blocks < 0) stat_dec(st->inactive_split, pool, (size_t)-net_blocks);
    if (net_bytes > 0) stat_inc(st->inactive_split_bytes, pool, (size_t)net_bytes);
    else if (net_bytes < 0) stat_dec(st->inactive_split_bytes, pool, (size_t)-net_bytes);
  }
  stat_dec(st->active, pool, 1);
  stat_dec(st->active_bytes, pool, original_size);
  stat_dec(st->requested_bytes, pool, requested);
  b->requested_size = 0;
}

/* ---- Events ----------------------------------------------------------------------------- */

/* A block's last event completed: its memory is free again. */
static void event_done(stash_heap_t* h, void* item) {
  pt_block* b = item;
  if (--b->event_count == 0) free_block(h, b);
}

/* PyTorch's insert_events, all or nothing: an event per stream the block was used on. */
static stash_status_t insert_events(stash_heap_t* h, pt_block* b) {
  stash_status_t st = _stash_events_record(h, &S(h)->events, b->uses, b->nuses, b);
  if (st != STASH_OK) return st;
  b->event_count += (int)b->nuses;
  b->nuses = 0;
  return STASH_OK;
}

/* PyTorch's process_events: complete the frees whose events are done, FIFO per stream. */
static stash_status_t process_events(stash_heap_t* h) {
  return _stash_events_poll(h, &S(h)->events, false, event_done);
}

/* PyTorch's synchronize_and_free_events: wait for every outstanding event. */
static stash_status_t synchronize_and_free_events(stash_heap_t* h) {
  h->stats.num_sync_all_streams++;
  return _stash_events_poll(h, &S(h)->events, true, event_done);
}

/* ---- Releasing memory -------------------------------------------------------------------- */

/* PyTorch's release_block: give an unsplit, free, plain segment back. */
static stash_status_t release_block(stash_heap_t* h, pt_block* b) {
  pt_state* s = S(h);
  stash_status_t st = PCALL(h, mem_free, h->device, b->ptr, b->size);
  if (st != STASH_OK) return prov_fail(h, st, "free a segment");
  _stash_history_add(h, STASH_TRACE_SEGMENT_FREE, b->ptr, b->size, b->stream);
  h->stats.num_device_free++;
  h->total_reserved -= b->size;
  stat_dec(h->stats.segment, b->pool, 1);
  stat_dec(h->stats.reserved_bytes, b->pool, b->size);
  if (b->size >= h->conf.max_split_size) _stash_stat_dec(&h->stats.oversize_segments, 1);
  pool_erase(b);
  pt_seg* g = b->seg;
  seg_unlink(s, g);
  seg_delete(s, g);
  block_delete(s, b);
  return STASH_OK;
}

static void trim_handles(pt_seg* g) {
  while (g->nhandles && !g->handles[g->nhandles - 1]) g->nhandles--;
}

/* Unmap and release pages [begin, end) of g, stopping at the first unmap that fails.
 * Returns how many pages were unmapped; *err gets the failure. */
static size_t unmap_pages(stash_heap_t* h, pt_seg* g, size_t begin, size_t end,
                          stash_status_t* err) {
  size_t i = begin;
  *err = STASH_OK;
  for (; i < end; i++) {
    stash_status_t st = PCALL(h, unmap, h->device, g->base + i * g->page, g->page);
    if (st != STASH_OK) {
      *err = prov_fail(h, st, "unmap a page");
      break;
    }
    uint64_t handle = g->handles[i];
    g->handles[i] = 0;
    st = PCALL(h, phys_release, h->device, handle);
    if (st != STASH_OK) {
      if (*err == STASH_OK) *err = prov_fail(h, st, "release a physical page");
      _stash_zombies_add(&S(h)->zombies, 0, 0, handle);
    }
  }
  trim_handles(g);
  return i - begin;
}

/* ExpandableSegment::map: back pages [begin, end) with new physical memory. All or
 * nothing. */
static stash_status_t seg_map(stash_heap_t* h, pt_seg* g, size_t begin, size_t end) {
  if (end > g->cap_handles) {
    size_t cap = g->cap_handles ? g->cap_handles : 16;
    while (cap < end) cap *= 2;
    if (cap > g->max_pages) cap = g->max_pages;
    uint64_t* v = realloc(g->handles, cap * sizeof *v);
    if (!v) return _stash_error(STASH_ERR_HOST_OOM, "expandable segment: out of host memory");
    memset(v + g->cap_handles, 0, (cap - g->cap_handles) * sizeof *v);
    g->handles = v;
    g->cap_handles = cap;
  }
  stash_status_t st = STASH_OK;
  size_t created = begin, mapped = begin;
  for (; created < end; created++) {
    st = PCALL(h, phys_create, h->device, g->page, &g->handles[created]);
    if (st != STASH_OK) {
      st = st == STASH_ERR_OOM ? STASH_ERR_OOM : prov_fail(h, st, "create a physical page");
      g->handles[created] = 0;
      goto undo;
    }
  }
  for (; mapped < end; mapped++) {
    st = PCALL(h, map, h->device, g->base + mapped * g->page, g->page, g->handles[mapped], 0);
    if (st != STASH_OK) {
      st = prov_fail(h, st, "map a page");
      goto undo;
    }
  }
  st = PCALL(h, set_access, h->device, g->base + begin * g->page, (end - begin) * g->page);
  if (st != STASH_OK) {
    st = prov_fail(h, st, "set access to mapped pages");
    goto undo;
  }
  if (end > g->nhandles) g->nhandles = end;
  return STASH_OK;
undo:
  for (size_t i = begin; i < created; i++) {
    uint64_t va = g->base + i * g->page;
    if (i < mapped && PCALL(h, unmap, h->device, va, g->page) != STASH_OK) {
      _stash_zombies_add(&S(h)->zombies, va, g->page, g->handles[i]); /* still mapped: later */
    } else if (PCALL(h, phys_release, h->device, g->handles[i]) != STASH_OK) {
      _stash_zombies_add(&S(h)->zombies, 0, 0, g->handles[i]);
    }
    g->handles[i] = 0;
  }
  trim_handles(g);
  return st;
}

/* PyTorch's unmap_block: unmap every whole page inside a free expandable block. */
static stash_status_t unmap_block(stash_heap_t* h, pt_block* b) {
  pt_state* s = S(h);
  pt_seg* g = b->seg;
  size_t off = (size_t)(b->ptr - g->base);
  size_t begin = (off + g->page - 1) / g->page;
  size_t end = (off + b->size) / g->page;
  if (begin >= end) return STASH_OK;
  pt_block* before = block_new(s);
  pt_block* after = block_new(s);
  if (!before || !after) {
    if (before) block_delete(s, before);
    if (after) block_delete(s, after);
    return _stash_error(STASH_ERR_HOST_OOM, "empty_cache: out of host memory");
  }
  /* Unmapping does not wait for the GPU: let the segment's stream finish first. */
  stash_status_t st = PCALL(h, stream_synchronize, h->device, g->stream);
  if (st != STASH_OK) {
    block_delete(s, before);
    block_delete(s, after);
    return prov_fail(h, st, "synchronize a stream");
  }
  stash_status_t err;
  size_t n = unmap_pages(h, g, begin, end, &err);
  if (n == 0) {
    block_delete(s, before);
    block_delete(s, after);
    return err;
  }
  end = begin + n;
  uint64_t uptr = g->base + begin * g->page;
  size_t usize = n * g->page;
  pool_erase(b);
  size_t before_size = (size_t)(uptr - b->ptr);
  if (before_size > 0) {
    before->ptr = b->ptr;
    before->size = before_size;
    before->stream = b->stream;
    before->pool = b->pool;
    before->seg = g;
    before->mapped = true;
    link_before(before, b);
    pool_insert_free(b->pool, before);
  } else {
    block_delete(s, before);
  }
  size_t after_size = b->size - (before_size + usize);
  if (after_size > 0) {
    after->ptr = uptr + usize;
    after->size = after_size;
    after->stream = b->stream;
    after->pool = b->pool;
    after->seg = g;
    after->mapped = true;
    link_after(after, b);
    pool_insert_free(b->pool, after);
  } else {
    block_delete(s, after);
  }
  b->ptr = uptr;
  b->size = usize;
  b->mapped = false;
  try_merge_blocks(s, b, b->prev);
  try_merge_blocks(s, b, b->next);
  pool_insert_unmapped(b->pool, b);
  _stash_history_add(h, STASH_TRACE_SEGMENT_UNMAP, uptr, usize, b->stream);
  h->total_reserved -= usize;
  stat_dec(h->stats.reserved_bytes, b->pool, usize);
  h->stats.num_device_free++;
  return err;
}

/* PyTorch's release_expandable_segment: free an entirely unmapped segment's range. */
static stash_status_t release_expandable_segment(stash_heap_t* h, pt_block* b) {
  pt_state* s = S(h);
  pt_seg* g = b->seg;
  if (_stash_zombies_within(&s->zombies, g->base, g->size) &&
      _stash_zombies_release(h, &s->zombies) != STASH_OK &&
      _stash_zombies_within(&s->zombies, g->base, g->size))
    return _stash_error(STASH_ERR_DRIVER, "cannot free an address range that still has a "
                        "page the provider refused to unmap");
  stash_status_t st = PCALL(h, va_free, h->device, g->base, g->max_pages * g->page);
  if (st != STASH_OK) return prov_fail(h, st, "free a virtual address range");
  pool_erase(b);
  seg_unlink(s, g);
  seg_delete(s, g);
  block_delete(s, b);
  return STASH_OK;
}

/* PyTorch's release_blocks: free every unsplit plain segment, unmap free expandable
 * pages. Returns the first error; continues past it. */
static stash_status_t release_blocks(stash_heap_t* h, pt_pool* pool) {
  stash_status_t first = STASH_OK;
  size_t n = 0, cap = 0;
  pt_block** to_unmap = NULL;
  bs_node_t* it = _stash_bs_first(&pool->blocks);
  while (it) {
    pt_block* b = B(it);
    it = _stash_bs_next(it);
    if (is_expandable(b)) {
      pt_block** v = _stash_array_grow(to_unmap, &cap, n + 1, sizeof *v, 16);
      if (!v) {
        if (first == STASH_OK)
          first = _stash_error(STASH_ERR_HOST_OOM, "empty_cache: out of host memory");
        break;
      }
      to_unmap = v;
      to_unmap[n++] = b;
    } else if (!is_split(b)) {
      stash_status_t st = release_block(h, b);
      if (st != STASH_OK && first == STASH_OK) first = st;
    }
  }
  for (size_t i = 0; i < n; i++) {
    pt_block* b = to_unmap[i];
    stash_status_t st = unmap_block(h, b);
    if (st != STASH_OK && first == STASH_OK) first = st;
    if (!b->mapped && !is_split(b)) {
      st = release_expandable_segment(h, b);
      if (st != STASH_OK && first == STASH_OK) first = st;
    }
  }
  free(to_unmap);
  return first;
}

/* PyTorch's release_cached_blocks (the default pool; no private pools). */
static stash_status_t release_cached_blocks(stash_heap_t* h) {
  stash_status_t st = synchronize_and_free_events(h);
  if (st != STASH_OK) return st;
  pt_state* s = S(h);
  stash_status_t a = release_blocks(h, &s->large);
  stash_status_t b = release_blocks(h, &s->small);
  stash_status_t z = _stash_zombies_release(h, &S(h)->zombies);
  return a != STASH_OK ? a : b != STASH_OK ? b : z;
}

/* PyTorch's release_available_cached_blocks: free oversize blocks, only as many as the
 * request needs. *released says whether the caller should retry. */
static stash_status_t release_available_cached_blocks(stash_heap_t* h, const alloc_params* p,
                                                      bool* released) {
  *released = false;
  size_t max_split = h->conf.max_split_size;
  if (max_split == SIZE_MAX) return STASH_OK;
  pt_pool* pool = p->pool;
  pt_block key = {.stream = p->stream, .size = p->size < max_split ? max_split : p->size};
  bs_node_t* it = _stash_bs_lower_bound(&pool->blocks, &key.node);
  if (!it || B(it)->stream != p->stream || is_expandable(B(it))) {
    /* No single block is large enough; free oversize blocks from the largest down. */
    if (it == _stash_bs_first(&pool->blocks)) return STASH_OK;
    it = it ? _stash_bs_prev(it) : _stash_bs_last(&pool->blocks);
    size_t total = 0;
    while (total < key.size && B(it)->size >= max_split && B(it)->stream == p->stream) {
      bs_node_t* cur = it;
      bool is_first = cur == _stash_bs_first(&pool->blocks);
      if (!is_first) it = _stash_bs_prev(it);
      if (!is_expandable(B(cur))) {
        size_t sz = B(cur)->size;
        stash_status_t st = release_block(h, B(cur));
        if (st != STASH_OK) return st;
        total += sz;
      }
      if (is_first) break;
    }
    if (total < key.size) return STASH_OK;
  } else {
    stash_status_t st = release_block(h, B(it));
    if (st != STASH_OK) return st;
  }
  *released = true;
  return STASH_OK;
}

/* PyTorch's garbage_collect_cached_blocks: free the oldest unsplit large segments until
 * usage is under garbage_collection_threshold * the limit. */
static stash_status_t garbage_collect_cached_blocks(stash_heap_t* h) {
  pt_state* s = S(h);
  size_t threshold =
      (size_t)(h->conf.garbage_collection_threshold * (double)h->allowed_max);
  if (h->total_reserved <= threshold) return STASH_OK;
  size_t target = h->total_reserved - threshold;
  size_t reclaimed = 0;
  size_t total_age = 0;
  int freeable = 0;
  pt_pool* pool = &s->large;
  for (bs_node_t* it = _stash_bs_first(&pool->blocks); it; it = _stash_bs_next(it)) {
    if (!is_split(B(it))) {
      total_age += (size_t)(int)(pool->get_free_blocks_call_count - B(it)->gc_count_base);
      freeable++;
    }
  }
  if (freeable == 0) return STASH_OK;
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    double age_threshold = (double)total_age / freeable;
    freed = false;
    bs_node_t* it = _stash_bs_first(&pool->blocks);
    while (it) {
      pt_block* b = B(it);
      it = _stash_bs_next(it);
      size_t age = (size_t)(int)(pool->get_free_blocks_call_count - b->gc_count_base);
      if (!is_split(b) && !is_expandable(b) && (double)age >= age_threshold) {
        size_t sz = b->size;
        stash_status_t st = release_block(h, b);
        if (st != STASH_OK) return st;
        freed = true;
        reclaimed += sz;
        total_age -= age;
        freeable--;
      }
    }
  }
  return STASH_OK;
}

/* ---- Finding and making blocks ------------------------------------------------------------- */

static size_t expandable_size(const pt_block* b) {
  return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
}

/* PyTorch's get_free_block: best fit on the request's stream, with the oversize rules. */
static bool get_free_block(stash_heap_t* h, alloc_params* p) {
  pt_pool* pool = p->pool;
  const stash_conf_t* c = &h->conf;
  if (h->has_limit && c->garbage_collection_threshold > 0.0) pool->get_free_blocks_call_count++;
  pt_block key = {.stream = p->stream, .size = p->size, .ptr = 0};
  bs_node_t* it = _stash_bs_lower_bound(&pool->blocks, &key.node);
  if (!it || B(it)->stream != p->stream) return false;
  if (is_expandable(B(it))) {
    if (p->expandable_active) {
      /* Count the unmapped room after a block as part of its size, so that a block that
       * cannot grow is preferred over the growable end of a segment. */
      bs_node_t* next = _stash_bs_next(it);
      while (is_expandable(B(it)) && next && B(next)->stream == p->stream &&
             expandable_size(B(next)) < expandable_size(B(it))) {
        it = next;
        next = _stash_bs_next(next);
      }
    } else {
      do {
        it = _stash_bs_next(it);
      } while (it && is_expandable(B(it)) && B(it)->stream == p->stream);
      if (!it || B(it)->stream != p->stream) return false;
    }
  }
  size_t bsize = B(it)->size;
  if (p->size < c->max_split_size && bsize >= c->max_split_size) return false;
  if (p->size >= c->max_split_size && bsize >= p->size + c->max_non_split_rounding) return false;
  p->block = B(it);
  pool_erase(p->block);
  return true;
}

static bool allocatable(const pt_block* b) {
  return b && !b->allocated && b->event_count == 0 && b->nuses == 0;
}

/* PyTorch's find_expandable_block: the lowest address where free and unmapped room adds
 * up to size, or a new segment. */
static stash_status_t find_expandable_block(stash_heap_t* h, pt_pool* pool, void* stream,
                                            size_t size, pt_block** out) {
  pt_state* s = S(h);
  pt_block key = {.stream = stream, .ptr = 0};
  for (bs_node_t* it = _stash_bs_lower_bound(&pool->unmapped, &key.node);
       it && B(it)->stream == stream; it = _stash_bs_next(it)) {
    pt_block* c = B(it);
    if (allocatable(c->prev)) c = c->prev;
    size_t bytes = 0;
    for (pt_block* b = c; bytes < size && allocatable(b); b = b->next) bytes += b->size;
    if (bytes >= size) {
      *out = c;
      return STASH_OK;
    }
  }
  size_t page = pool->is_small ? kSmallBuffer : h->conf.large_segment_size;
  size_t total = h->device_total;
  size_t max_pages = (total + total / 8 + page - 1) / page;
  pt_seg* g = _stash_slab_alloc(&s->seg_slab);
  pt_block* b = block_new(s);
  if (!g || !b) {
    if (g) seg_delete(s, g);
    if (b) block_delete(s, b);
    return _stash_error(STASH_ERR_HOST_OOM, "expandable segment: out of host memory");
  }
  stash_status_t st = PCALL(h, va_reserve, h->device, page * max_pages, &g->base);
  if (st != STASH_OK) {
    seg_delete(s, g);
    block_delete(s, b);
    return st == STASH_ERR_OOM ? st : prov_fail(h, st, "reserve a virtual address range");
  }
  g->size = page * max_pages;
  g->pool = pool;
  g->stream = stream;
  g->expandable = true;
  g->page = page;
  g->max_pages = max_pages;
  g->head = b;
  seg_link(s, g);
  b->ptr = g->base;
  b->size = g->size;
  b->stream = stream;
  b->pool = pool;
  b->seg = g;
  b->mapped = false;
  pool_insert_unmapped(pool, b);
  *out = b;
  return STASH_OK;
}

/* PyTorch's map_block: back the first `size` bytes of an unmapped block with pages. */
static stash_status_t map_block(stash_heap_t* h, pt_block* to_map, size_t size) {
  pt_state* s = S(h);
  pt_seg* g = to_map->seg;
  size_t off = (size_t)(to_map->ptr - g->base);
  size_t begin = off / g->page;
  size_t end = (off + size + g->page - 1) / g->page;
  pt_block* remaining = block_new(s);
  if (!remaining) return _stash_error(STASH_ERR_HOST_OOM, "expandable segment: out of host memory");
  stash_status_t st = seg_map(h, g, begin, end);
  if (st != STASH_OK) {
    block_delete(s, remaining);
    return st;
  }
  size_t mapped = (end - begin) * g->page;
  pt_pool* pool = to_map->pool;
  pool_erase(to_map);
  to_map->mapped = true;
  if (mapped < to_map->size) {
    remaining->ptr = to_map->ptr + mapped;
    remaining->size = to_map->size - mapped;
    remaining->stream = to_map->stream;
    remaining->pool = pool;
    remaining->seg = g;
    remaining->mapped = false;
    link_after(remaining, to_map);
    pool_insert_unmapped(pool, remaining);
    to_map->size = mapped;
  } else {
    block_delete(s, remaining);
  }
  try_merge_blocks(s, to_map, to_map->prev);
  try_merge_blocks(s, to_map, to_map->next);
  pool_insert_free(pool, to_map);
  _stash_history_add(h, STASH_TRACE_SEGMENT_MAP, to_map->ptr, mapped, to_map->stream);
  h->total_reserved += mapped;
  stat_inc(h->stats.reserved_bytes, pool, mapped);
  h->stats.num_device_alloc++;
  return STASH_OK;
}

/* PyTorch's try_allocate_expandable_block. */
static stash_status_t try_allocate_expandable_block(stash_heap_t* h, alloc_params* p,
                                                    pt_block** out) {
  pt_block* c = NULL;
  stash_status_t st = find_expandable_block(h, p->pool, p->stream, p->size, &c);
  if (st != STASH_OK) return st;
  if (!c->mapped) {
    st = map_block(h, c, c->size < p->size ? c->size : p->size);
    if (st != STASH_OK) return st;
  }
  while (c->size < p->size) {
    size_t remaining = p->size - c->size;
    pt_block* nc = c->next;
    st = map_block(h, nc, remaining < nc->size ? remaining : nc->size);
    if (st != STASH_OK) return st;
    c = nc;
  }
  pool_erase(c);
  *out = c;
  return STASH_OK;
}

/* PyTorch's alloc_block: a new segment (or mapped pages). false with p->err == OOM when
 * the device (or the memory fraction) refuses; false with another p->err on failure. */
static bool alloc_block(stash_heap_t* h, alloc_params* p, bool is_retry) {
  pt_state* s = S(h);
  size_t size = p->alloc_size;
  if (is_retry) h->stats.num_alloc_retries++;
  if (h->has_limit && h->total_reserved + size > h->allowed_max) {
    p->err = STASH_ERR_OOM;
    return false;
  }
  if (p->expandable_active) {
    p->err = try_allocate_expandable_block(h, p, &p->block);
    return p->err == STASH_OK;
  }
  pt_seg* g = _stash_slab_alloc(&s->seg_slab);
  pt_block* b = block_new(s);
  if (!g || !b) {
    if (g) seg_delete(s, g);
    if (b) block_delete(s, b);
    p->err = _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    return false;
  }
  uint64_t ptr = 0;
  stash_status_t st = PCALL(h, mem_alloc, h->device, size, &ptr);
  if (st != STASH_OK) {
    seg_delete(s, g);
    block_delete(s, b);
    p->err = st == STASH_ERR_OOM ? st : prov_fail(h, st, "allocate a segment");
    return false;
  }
  g->base = ptr;
  g->size = size;
  g->pool = p->pool;
  g->stream = p->stream;
  g->head = b;
  seg_link(s, g);
  b->ptr = ptr;
  b->size = size;
  b->stream = p->stream;
  b->pool = p->pool;
  b->seg = g;
  b->mapped = true;
  h->total_reserved += size;
  stat_inc(h->stats.segment, p->pool, 1);
  stat_inc(h->stats.reserved_bytes, p->pool, size);
  if (size >= h->conf.max_split_size) _stash_stat_inc(&h->stats.oversize_segments, 1);
  h->stats.num_device_alloc++;
  _stash_history_add(h, STASH_TRACE_SEGMENT_ALLOC, ptr, size, p->stream);
  p->block = b;
  p->err = STASH_OK;
  return true;
}

/* PyTorch's alloc_found_block: split off the front of the block if the rules say so. */
static pt_block* alloc_found_block(stash_heap_t* h, alloc_params* p, size_t orig_size,
                                   bool split, pt_block* spare) {
  pt_block* b = p->block;
  pt_pool* pool = p->pool;
  const bool already_split = is_split(b);
  if (split) {
    pt_block* rest = b;
    b = spare;
    b->ptr = rest->ptr;
    b->size = p->size;
    b->stream = p->stream;
    b->pool = pool;
    b->seg = rest->seg;
    b->mapped = true;
    link_before(b, rest);
    rest->ptr += p->size;
    rest->size -= p->size;
    pool_insert_free(pool, rest);
    if (!is_expandable(b)) {
      if (already_split) {
        stat_dec(h->stats.inactive_split_bytes, pool, b->size);
      } else {
        stat_inc(h->stats.inactive_split_bytes, pool, rest->size);
        stat_inc(h->stats.inactive_split, pool, 1);
      }
    }
  } else {
    block_delete(S(h), spare);
    if (already_split && !is_expandable(b)) {
      stat_dec(h->stats.inactive_split_bytes, pool, b->size);
      stat_dec(h->stats.inactive_split, pool, 1);
    }
  }
  b->allocated = true;
  b->requested_size = orig_size;
  stash_stats_t* st = &h->stats;
  stat_inc(st->allocation, pool, 1);
  stat_inc(st->allocated_bytes, pool, b->size);
  stat_inc(st->active, pool, 1);
  stat_inc(st->active_bytes, pool, b->size);
  stat_inc(st->requested_bytes, pool, b->requested_size);
  if (b->size >= h->conf.max_split_size) _stash_stat_inc(&st->oversize_allocations, 1);
  return b;
}

/* Largest free cached block (PyTorch's cacheInfo). */
static size_t largest_free_block(pt_state* s) {
  size_t best = 0;
  pt_pool* pools[2] = {&s->large, &s->small};
  for (int i = 0; i < 2; i++) {
    for (bs_node_t* it = _stash_bs_first(&pools[i]->blocks); it; it = _stash_bs_next(it)) {
      if (B(it)->size > best) best = B(it)->size;
    }
  }
  return best;
}

/* Give back expandable segments that have no mapped page at all (left by a failed map). */
static void release_empty_expandable_segments(stash_heap_t* h) {
  pt_state* s = S(h);
  pt_seg* g = s->segs;
  while (g) {
    pt_seg* next = g->next_seg;
    /* Quietly: this runs after the call's own error was reported. */
    if (g->expandable && g->nhandles == 0 && !g->head->next && !g->head->mapped &&
        !_stash_zombies_within(&s->zombies, g->base, g->size) &&
        PCALL(h, va_free, h->device, g->base, g->size) == STASH_OK) {
      pt_block* b = g->head;
      pool_erase(b);
      seg_unlink(s, g);
      seg_delete(s, g);
      block_delete(s, b);
    }
    g = next;
  }
}

static stash_status_t report_oom(stash_heap_t* h, size_t orig_size, const alloc_params* p) {
  char needed[48], size[32];
  _stash_format_size(p->expandable_active ? orig_size : p->alloc_size, size, sizeof size);
  snprintf(needed, sizeof needed, "%s%s", p->expandable_active ? "pages for " : "a segment of ",
           size);
  return _stash_report_oom(h, orig_size, p->stream, needed, largest_free_block(S(h)), NULL);
}

/* ---- The policy's entry points ------------------------------------------------------------ */

static stash_status_t pt_alloc(stash_heap_t* h, size_t orig_size, void* stream, uint64_t* out) {
  pt_state* s = S(h);
  /* Everything that can fail for lack of host memory is reserved first. */
  if (_stash_ptrmap_reserve(&s->allocated, 1) != STASH_OK)
    return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  pt_block* spare = block_new(s);
  if (!spare) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");

  stash_status_t st = process_events(h);
  if (st != STASH_OK) {
    block_delete(s, spare);
    return st;
  }
  const stash_conf_t* c = &h->conf;
  alloc_params p = {0};
  p.size = round_size(c, orig_size);
  p.stream = stream;
  p.pool = p.size <= kSmallSize ? &s->small : &s->large;
  p.alloc_size = get_allocation_size(c, p.size);
  p.expandable_active = c->expandable_segments;

  bool found = get_free_block(h, &p);
  if (!found) {
    if (h->has_limit && c->garbage_collection_threshold > 0.0) {
      st = garbage_collect_cached_blocks(h);
      if (st != STASH_OK) goto fail;
    }
    found = alloc_block(h, &p, false);
    if (!found && p.err == STASH_ERR_OOM) {
      bool released;
      st = release_available_cached_blocks(h, &p, &released);
      if (st != STASH_OK) goto fail;
      if (released) found = alloc_block(h, &p, false);
    }
    if (!found && p.err == STASH_ERR_OOM && !h->capturing) { /* not in a capture: PyTorch's */
      st = release_cached_blocks(h);
      if (st != STASH_OK) goto fail;
      found = alloc_block(h, &p, true);
    }
    if (!found && p.err != STASH_ERR_OOM) {
      st = p.err;
      goto fail;
    }
  }
  if (!found) {
    st = report_oom(h, orig_size, &p);
    goto fail;
  }
  bool split = should_split(c, p.block, p.size, p.expandable_active);
  pt_block* b = alloc_found_block(h, &p, orig_size, split, spare);
  _stash_ptrmap_put(&s->allocated, b->ptr, b); /* cannot fail: reserved above */
  _stash_history_add(h, STASH_TRACE_ALLOC, b->ptr, orig_size, stream);
  *out = b->ptr;
  return STASH_OK;
fail:
  block_delete(s, spare);
  release_empty_expandable_segments(h);
  return st;
}

static stash_status_t pt_free(stash_heap_t* h, uint64_t ptr) {
  pt_state* s = S(h);
  pt_block* b = _stash_ptrmap_take(&s->allocated, ptr); /* one lookup: put back on failure */
  if (!b)
    return _stash_error(STASH_ERR_BAD_POINTER,
                        "free: 0x%" PRIx64 " is not a live allocation of this heap (never "
                        "allocated here, already freed, or not the start of a block)",
                        ptr);
  if (b->nuses) {
    stash_status_t st = insert_events(h, b);
    if (st != STASH_OK) {
      (void)_stash_ptrmap_put(&s->allocated, ptr, b); /* cannot fail: its slot was just freed */
      return st;
    }
  }
  _stash_history_add(h, STASH_TRACE_FREE_REQUESTED, b->ptr, b->requested_size, b->stream);
  b->allocated = false;
  stat_dec(h->stats.allocation, b->pool, 1);
  stat_dec(h->stats.allocated_bytes, b->pool, b->size);
  if (b->size >= h->conf.max_split_size) _stash_stat_dec(&h->stats.oversize_allocations, 1);
  if (b->event_count == 0) free_block(h, b);
  return STASH_OK;
}

static stash_status_t pt_record_stream(stash_heap_t* h, uint64_t ptr, void* stream) {
  pt_block* b = _stash_ptrmap_get(&S(h)->allocated, ptr);
  if (!b)
    return _stash_error(STASH_ERR_BAD_POINTER,
                        "record_stream: 0x%" PRIx64 " is not a live allocation of this heap",
                        ptr);
  if (stream == b->stream) return STASH_OK; /* uses on the allocation stream need nothing */
  return _stash_uses_add(&b->uses, &b->nuses, &b->cap_uses, stream);
}

static stash_status_t pt_empty_cache(stash_heap_t* h) { return release_cached_blocks(h); }

static stash_status_t pt_create(stash_heap_t* h) {
  pt_state* s = calloc(1, sizeof *s);
  if (!s) return _stash_error(STASH_ERR_HOST_OOM, "stash_heap_create: out of host memory");
  pool_sets_init(&s->large);
  pool_sets_init(&s->small);
  s->small.is_small = true;
  _stash_slab_init(&s->block_slab, sizeof(pt_block));
  _stash_slab_init(&s->seg_slab, sizeof(pt_seg));
  _stash_ptrmap_init(&s->allocated);
  h->policy_state = s;
  return STASH_OK;
}

static stash_status_t pt_destroy(stash_heap_t* h) {
  pt_state* s = S(h);
  stash_status_t first = STASH_OK;
#define KEEP(x) _STASH_KEEP_FIRST(first, x)
  KEEP(_stash_events_destroy(h, &s->events));
  KEEP(_stash_zombies_release(h, &S(h)->zombies));
  for (pt_seg* g = s->segs; g;) {
    pt_seg* next = g->next_seg;
    if (g->expandable) {
      for (size_t i = 0; i < g->nhandles; i++) {
        if (!g->handles[i]) continue;
        KEEP(PCALL(h, unmap, h->device, g->base + i * g->page, g->page));
        KEEP(PCALL(h, phys_release, h->device, g->handles[i]));
      }
      KEEP(PCALL(h, va_free, h->device, g->base, g->size));
    } else {
      KEEP(PCALL(h, mem_free, h->device, g->base, g->size));
    }
    for (pt_block* b = g->head; b;) {
      pt_block* bn = b->next;
      free(b->uses);
      b = bn;
    }
    free(g->handles);
    g = next;
  }
#undef KEEP
  if (first != STASH_OK) first = prov_fail(h, first, "give memory back while destroying the heap");
  _stash_zombies_free(&s->zombies);
  _stash_ptrmap_free(&s->allocated);
  _stash_slab_destroy(&s->block_slab);
  _stash_slab_destroy(&s->seg_slab);
  free(s);
  h->policy_state = NULL;
  return first;
}

/* ---- Introspection ------------------------------------------------------------------------ */

static int seg_cmp(const void* a, const void* b) {
  const pt_seg* x = *(const pt_seg* const*)a;
  const pt_seg* y = *(const pt_seg* const*)b;
  return cmp_u(x->base, y->base);
}

/* The segments sorted by address (caller frees), or NULL with *n == 0 on an empty heap. */
static stash_status_t sorted_segments(pt_state* s, pt_seg*** out, size_t* n) {
  size_t count = 0;
  for (pt_seg* g = s->segs; g; g = g->next_seg) count++;
  *out = NULL;
  *n = count;
  if (!count) return STASH_OK;
  pt_seg** v = malloc(count * sizeof *v);
  if (!v) return _stash_error(STASH_ERR_HOST_OOM, "out of host memory");
  size_t i = 0;
  for (pt_seg* g = s->segs; g; g = g->next_seg) v[i++] = g;
  qsort(v, count, sizeof *v, seg_cmp);
  *out = v;
  return STASH_OK;
}

static stash_status_t pt_visit(stash_heap_t* h, stash_visit_fn fn, void* arg) {
  pt_state* s = S(h);
  pt_seg** segs;
  size_t nsegs;
  stash_status_t st = sorted_segments(s, &segs, &nsegs);
  if (st != STASH_OK) return st;
  stash_block_info_t* infos = NULL;
  size_t cap = 0;
  for (size_t i = 0; i < nsegs && st == STASH_OK; i++) {
    pt_seg* g = segs[i];
    size_t nb = 0;
    for (pt_block* b = g->head; b; b = b->next) nb++;
    if (nb > cap) {
      stash_block_info_t* v = realloc(infos, nb * sizeof *v);
      if (!v) {
        st = _stash_error(STASH_ERR_HOST_OOM, "stash_heap_visit: out of host memory");
        break;
      }
      infos = v;
      cap = nb;
    }
    stash_segment_info_t si = {.address = (uintptr_t)g->base,
                               .is_small = g->pool->is_small,
                               .is_expandable = g->expandable,
                               .stream = g->stream,
                               .nblocks = nb};
    size_t k = 0;
    for (pt_block* b = g->head; b; b = b->next, k++) {
      stash_block_info_t* bi = &infos[k];
      bi->address = (uintptr_t)b->ptr;
      bi->size = b->size;
      bi->requested_size = b->requested_size;
      bi->stream = b->stream;
      if (!b->mapped) bi->state = STASH_BLOCK_UNMAPPED;
      else if (b->allocated) bi->state = STASH_BLOCK_ALLOCATED;
      else if (b->event_count > 0) bi->state = STASH_BLOCK_PENDING_FREE;
      else bi->state = STASH_BLOCK_FREE;
      si.total_size += b->size;
      if (b->mapped) si.mapped_size += b->size;
    }
    if (fn(&si, infos, arg)) break;
  }
  free(infos);
  free(segs);
  return st;
}

#define FAIL(...) return _stash_error(STASH_ERR_INVALID, "heap check: " __VA_ARGS__)

static void pending_ok(void* item, void* arg) {
  const pt_block* b = item;
  if (b->allocated || b->event_count <= 0) *(int*)arg = 1;
}

static stash_status_t pt_check(stash_heap_t* h) {
  pt_state* s = S(h);
  pt_pool* pools[2] = {&s->small, &s->large};
  for (int i = 0; i < 2; i++) {
    if (!_stash_bs_valid(&pools[i]->blocks)) FAIL("the free-block tree is malformed");
    if (!_stash_bs_valid(&pools[i]->unmapped)) FAIL("the unmapped tree is malformed");
  }
  /* Recompute every current statistic from the blocks. */
  stash_stat_counts_t n = {0}; /* the statistics, counted from the blocks */
  int64_t oversize_alloc = 0, oversize_seg = 0;
  size_t free_count[2] = {0}, unmapped_count[2] = {0}, allocated_count = 0;
  size_t reserved = 0;
  for (pt_seg* g = s->segs; g; g = g->next_seg) {
    int t = g->pool->is_small ? STASH_STAT_SMALL : STASH_STAT_LARGE;
    int pi = g->pool->is_small ? 0 : 1;
    if (g->pool != &s->small && g->pool != &s->large) FAIL("a segment has no pool");
    if (!g->head || g->head->prev) FAIL("segment 0x%" PRIx64 " has a bad head", g->base);
    uint64_t expect = g->base;
    size_t mapped_bytes = 0;
    for (pt_block* b = g->head; b; b = b->next) {
      if (b->seg != g || b->pool != g->pool || b->stream != g->stream)
        FAIL("block 0x%" PRIx64 " disagrees with its segment", b->ptr);
      if (b->ptr != expect) FAIL("a gap or overlap at 0x%" PRIx64 " in segment 0x%" PRIx64, expect, g->base);
      if (b->size == 0) FAIL("empty block at 0x%" PRIx64, b->ptr);
      if (b->next && b->next->prev != b) FAIL("broken links at 0x%" PRIx64, b->ptr);
      if (b->ptr % kMinBlockSize || b->size % kMinBlockSize) FAIL("unaligned block 0x%" PRIx64, b->ptr);
      expect = b->ptr + b->size;
      bool free_now = !b->allocated && b->event_count == 0 && b->nuses == 0;
      if (!b->mapped) {
        if (!g->expandable) FAIL("unmapped block in a plain segment");
        if (b->allocated || b->where != IN_UNMAPPED) FAIL("unmapped block 0x%" PRIx64 " misfiled", b->ptr);
        if ((b->ptr - g->base) % g->page || b->size % g->page) FAIL("unmapped block not page-aligned");
        for (uint64_t p = (b->ptr - g->base) / g->page; p < (b->ptr - g->base + b->size) / g->page; p++) {
          if (p < g->nhandles && g->handles[p]) FAIL("unmapped block over a mapped page");
        }
        unmapped_count[pi]++;
        if (b->prev && !b->prev->mapped) FAIL("adjacent unmapped blocks not merged");
        continue;
      }
      mapped_bytes += b->size;
      if (g->expandable) {
        size_t first = (size_t)(b->ptr - g->base) / g->page;
        size_t last = (size_t)(b->ptr - g->base + b->size - 1) / g->page;
        for (size_t p = first; p <= last; p++) {
          if (p >= g->nhandles || !g->handles[p]) FAIL("mapped block 0x%" PRIx64 " over an unmapped page", b->ptr);
        }
      }
      if (free_now) {
        if (b->where != IN_BLOCKS) FAIL("free block 0x%" PRIx64 " not in the free set", b->ptr);
        if (b->prev && b->prev->mapped && !b->prev->allocated && b->prev->event_count == 0 &&
            b->prev->nuses == 0)
          FAIL("adjacent free blocks at 0x%" PRIx64 " not merged", b->ptr);
        free_count[pi]++;
        if (!g->expandable && is_split(b)) {
          n.inactive_split[t]++;
          n.inactive_split_bytes[t] += (int64_t)b->size;
        }
      } else {
        if (b->where != IN_NONE) FAIL("active block 0x%" PRIx64 " in a free set", b->ptr);
        n.active[t]++;
        n.active_bytes[t] += (int64_t)b->size;
        n.requested_bytes[t] += (int64_t)b->requested_size;
        if (b->allocated) {
          n.allocation[t]++;
          n.allocated_bytes[t] += (int64_t)b->size;
          allocated_count++;
          if (_stash_ptrmap_get(&s->allocated, b->ptr) != b)
            FAIL("allocated block 0x%" PRIx64 " missing from the address map", b->ptr);
          if (b->size >= h->conf.max_split_size) oversize_alloc++;
        } else if (b->nuses) {
          FAIL("freed block 0x%" PRIx64 " still has stream uses", b->ptr);
        }
      }
    }
    if (expect != g->base + g->size) FAIL("segment 0x%" PRIx64 " blocks do not span it", g->base);
    if (g->expandable) {
      size_t pages = 0;
      for (size_t p = 0; p < g->nhandles; p++) pages += g->handles[p] != 0;
      if (g->nhandles && !g->handles[g->nhandles - 1]) FAIL("untrimmed handle list");
      n.reserved_bytes[t] += (int64_t)(pages * g->page);
      reserved += pages * g->page;
      (void)mapped_bytes;
    } else {
      n.segment[t]++;
      n.reserved_bytes[t] += (int64_t)g->size;
      reserved += g->size;
      if (g->size >= h->conf.max_split_size) oversize_seg++;
    }
  }
  for (int i = 0; i < 2; i++) {
    if (free_count[i] != pools[i]->blocks.count) FAIL("a free set holds blocks that are not free");
    if (unmapped_count[i] != pools[i]->unmapped.count) FAIL("the unmapped set is out of date");
  }
  if (allocated_count != s->allocated.count) FAIL("the address map holds stale entries");
  if (reserved != h->total_reserved) FAIL("total reserved %zu != %zu counted", h->total_reserved, reserved);
  const stash_stats_t* st = &h->stats;
  stash_status_t r = _stash_stats_check(st, &n);
  if (r != STASH_OK) return r;
  if (st->oversize_allocations.current != oversize_alloc) FAIL("oversize_allocations is off");
  if (st->oversize_segments.current != oversize_seg) FAIL("oversize_segments is off");
  /* Every pending event points at a freed block that counts it. */
  int bad = 0;
  _stash_events_foreach(&s->events, pending_ok, &bad);
  if (bad) FAIL("an event waits on a block that is not pending");
  return STASH_OK;
}

const stash_policy_ops_t _stash_policy_pytorch = {
    .name = "pytorch",
    .create = pt_create,
    .destroy = pt_destroy,
    .alloc = pt_alloc,
    .free = pt_free,
    .record_stream = pt_record_stream,
    .empty_cache = pt_empty_cache,
    .visit = pt_visit,
    .check = pt_check,
};
