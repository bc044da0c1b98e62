/* policy_stash_check.c: policy:stash's introspection - the heap's segments and blocks as
 * stash_heap_visit walks them (_stash_sb_visit: the arenas, and each stitched range as its
 * block and the pages lent to it), and the invariant checker (_stash_sb_check: the blocks tile
 * the arenas and the free sets hold the free ones; the counts of memory, of cached, lazy and
 * given-back allocations, of the pages stitched ranges map; what the ranges lend; the
 * statistics recounted from the blocks; the pending events). It reads the heap and changes
 * nothing.
 *
 * Called through the policy table (policy_stash.c); calls policy_stash_arena.c.
 *
 * Synchronization: every function here runs under the heap's lock (heap.c).
 */
#include <inttypes.h>
#include <stdlib.h>

#include "policy_stash_blocks.h"

/* ---- Introspection -------------------------------------------------------------------------- */

/* The block starting at ptr, from the address-ordered chain (K_VOID blocks are in no set). */
static sb_block* block_at(sb_arena* a, uint64_t ptr) {
  sb_block* b = a->first;
  while (b && b->ptr < ptr) b = b->next;
  return b && b->ptr == ptr ? b : NULL;
}

static stash_block_state_t state_of(const sb_block* b) {
  if (b->kind == K_FREE || b->kind == K_CACHED) return STASH_BLOCK_FREE;
  if (b->kind == K_PHANTOM) return STASH_BLOCK_LENT;
  if (b->kind == K_DEAD || b->kind == K_VOID) return STASH_BLOCK_UNMAPPED; /* none usable */
  return b->allocated ? STASH_BLOCK_ALLOCATED : STASH_BLOCK_PENDING_FREE;
}

typedef struct sb_seg_ref_s { /* a segment to visit: an arena or a stitched range */
  uint64_t address;
  sb_arena* arena;
  sb_stitch* stitch;
} sb_seg_ref;

static int cmp_seg_ref(const void* a, const void* b) {
  return cmp_u64(((const sb_seg_ref*)a)->address, ((const sb_seg_ref*)b)->address);
}

/* An arena's blocks as they are; a stitched range as its user block (if any) and the rest
 * of its pages (ALIAS: their memory is counted where it is LENT, in the large arena). */
static int visit_one(const sb_seg_ref* r, stash_visit_fn fn, void* arg,
                     stash_block_info_t** infos, size_t* cap, stash_status_t* st) {
  if (r->arena) {
    sb_arena* a = r->arena;
    size_t n = 0;
    for (sb_block* b = a->first; b; b = b->next) n++;
    if (n > *cap) {
      stash_block_info_t* v = realloc(*infos, n * sizeof *v);
      if (!v) {
        *st = _stash_error(STASH_ERR_HOST_OOM, "stash_heap_visit: out of host memory");
        return 1;
      }
      *infos = v;
      *cap = n;
    }
    size_t k = 0;
    for (sb_block* b = a->first; b; b = b->next, k++) {
      (*infos)[k] = (stash_block_info_t){(uintptr_t)b->ptr, b->size, b->requested,
                                         state_of(b), b->stream};
    }
    stash_segment_info_t si = {(uintptr_t)a->base, a->mapped, a->mapped - a->released, a->small,
                               true, NULL, n};
    return fn(&si, *infos, arg);
  }
  sb_stitch* x = r->stitch;
  stash_block_info_t bi[3];
  size_t n = 0, span = x->npages * x->page;
  if (x->user) {
    size_t end = x->offset + x->user->size;
    if (x->offset)
      bi[n++] = (stash_block_info_t){(uintptr_t)x->va, x->offset, 0, STASH_BLOCK_ALIAS, NULL};
    bi[n++] = (stash_block_info_t){(uintptr_t)(x->va + x->offset), x->user->size,
                                   x->user->requested, state_of(x->user), x->user->stream};
    if (end < span)
      bi[n++] = (stash_block_info_t){(uintptr_t)(x->va + end), span - end, 0, STASH_BLOCK_ALIAS,
                                     NULL};
  } else {
    bi[n++] = (stash_block_info_t){(uintptr_t)x->va, span, 0, STASH_BLOCK_ALIAS, NULL};
  }
  stash_segment_info_t si = {(uintptr_t)x->va, span, 0, false, true,
                             x->user ? x->user->stream : NULL, n};
  return fn(&si, bi, arg);
}

stash_status_t _stash_sb_visit(stash_heap_t* h, stash_visit_fn fn, void* arg) {
  sb_state* s = S(h);
  size_t n = 2;
  for (sb_stitch* x = s->stitches; x; x = x->next_st) n++;
  sb_seg_ref* refs = malloc(n * sizeof *refs);
  if (!refs) return _stash_error(STASH_ERR_HOST_OOM, "stash_heap_visit: out of host memory");
  size_t k = 0;
  for (int i = 0; i < 2; i++) {
    if (s->arenas[i].mapped) refs[k++] = (sb_seg_ref){s->arenas[i].base, &s->arenas[i], NULL};
  }
  for (sb_stitch* x = s->stitches; x; x = x->next_st) refs[k++] = (sb_seg_ref){x->va, NULL, x};
  qsort(refs, k, sizeof *refs, cmp_seg_ref);
  stash_block_info_t* infos = NULL;
  size_t cap = 0;
  stash_status_t st = STASH_OK;
  for (size_t i = 0; i < k; i++) {
    if (visit_one(&refs[i], fn, arg, &infos, &cap, &st)) break;
  }
  free(infos);
  free(refs);
  return st;
}

#define FAIL(...) return _stash_error(STASH_ERR_INVALID, "heap check: " __VA_ARGS__)

typedef struct pending_s {
  bool bad;
  double blocks; /* distinct blocks: each is queued event_count times, 1/event_count each */
} pending_t;

static void pending_ok(void* item, void* arg) {
  if ((uintptr_t)item & 1) return; /* an epoch marker */
  const sb_block* b = item;
  pending_t* p = arg;
  if (b->kind != K_USER || b->allocated || b->event_count <= 0) p->bad = true;
  else p->blocks += 1.0 / b->event_count;
}

/* Count user block b (pool t) into n, and into *live if allocated; false if a live block
 * is missing from the address map. */
static bool count_user(sb_state* s, stash_stat_counts_t* n, int t, const sb_block* b,
                       size_t* live) {
  n->active[t]++;
  n->active_bytes[t] += (int64_t)b->size;
  n->requested_bytes[t] += (int64_t)b->requested;
  if (!b->allocated) return true;
  n->allocation[t]++;
  n->allocated_bytes[t] += (int64_t)b->size;
  (*live)++;
  return _stash_ptrmap_get(&s->allocated, b->ptr) == b;
}

stash_status_t _stash_sb_check(stash_heap_t* h) {
  sb_state* s = S(h);
  stash_stat_counts_t n = {0}; /* the statistics, counted from the blocks */
  size_t live = 0, total = 0, ncached = 0;
  for (size_t i = 0; i < kCacheSizes; i++) {
    for (sb_block* b = s->cache[i]; b; b = b->tnext) {
      if (b->kind != K_CACHED || b->size != (i + 1) * kMinBlock || !b->arena || !b->arena->small)
        FAIL("a bad block in the cache of %zu-byte blocks", (i + 1) * kMinBlock);
      if (b->tag < 1 || b->tag > s->nstreams || b->epoch > s->streams[b->tag].epoch_next)
        FAIL("a cached block of %zu bytes has a bad stream tag or epoch", b->size);
      if (++ncached > s->ncached) FAIL("the cache holds more blocks than it counts");
    }
  }
  if (ncached != s->ncached) FAIL("the cache counts %zu blocks, holds %zu", s->ncached, ncached);
  for (int i = 0; i < 2; i++) {
    sb_arena* a = &s->arenas[i];
    int t = a->small ? STASH_STAT_SMALL : STASH_STAT_LARGE;
    if (!_stash_bs_valid(&a->by_addr)) FAIL("an address tree is malformed");
    size_t nfree = 0, nsize = 0;
    for (size_t k = 0; k <= s->nstreams; k++) {
      if (!_stash_bs_valid(&a->by_size[k])) FAIL("a size tree is malformed");
      nsize += a->by_size[k].count;
    }
    size_t pages = 0;
    size_t nlazy = 0, nreleased = 0, released = 0;
    for (size_t k = 0; k < a->nhandles; k++) {
      const sb_handle* hd = &a->handles[k];
      if (hd->first_page != pages) FAIL("physical allocations do not tile an arena");
      pages += hd->npages;
      if (hd->access == H_RELEASED) {
        nreleased++;
        released += hd->npages * G;
        const sb_block* v = block_at(a, a->base + hd->first_page * G);
        if (!v || v->kind != K_VOID || v->size != hd->npages * G)
          FAIL("memory given back is not one void block at 0x%" PRIx64,
               a->base + hd->first_page * G);
        if (ranged_pages(a, hd->first_page, hd->npages))
          FAIL("memory given back at 0x%" PRIx64 " is still mapped by a stitched range",
               a->base + hd->first_page * G);
      } else {
        nlazy += hd->access != H_READY;
        if (hd->access != H_READY && hd->first_page < a->lazy_from)
          FAIL("an allocation not yet usable in its arena lies below the arena's bound for them");
      }
    }
    if (nlazy != a->nlazy) FAIL("an arena's count of unmapped allocations is wrong");
    if (nreleased != a->nreleased || released != a->released)
      FAIL("an arena's count of memory given back is wrong");
    if (pages * G != a->mapped) FAIL("an arena's mapped size disagrees with its memory");
    n.segment[t] += (int64_t)(a->nhandles - a->nreleased);
    n.reserved_bytes[t] += (int64_t)(a->mapped - a->released);
    total += a->mapped - a->released;
    size_t nvoid = 0, free_sum = 0;
    uint64_t expect = a->base;
    for (sb_block* b = a->first; b; b = b->next) {
      if (b->ptr != expect || !b->size || b->arena != a) FAIL("blocks do not tile an arena at 0x%" PRIx64, expect);
      if (b->ptr % kMinBlock || b->size % kMinBlock) FAIL("an unaligned block");
      if (b->next && b->next->prev != b) FAIL("broken links");
      expect += b->size;
      if (b->kind == K_FREE) {
        nfree++;
        free_sum += b->size;
        if (b->tag > s->nstreams) FAIL("a bad tag");
        if (free_containing(a, b->ptr, b->size) != b) FAIL("a free block is not in the address tree");
        if (b->prev && b->prev->kind == K_FREE && tags_merge(s, b->tag, b->prev->tag))
          FAIL("free neighbours not merged at 0x%" PRIx64, b->ptr);
      } else if (b->kind == K_VOID) {
        nvoid++; /* each checked above, against its allocation */
      } else if (b->kind == K_DEAD || b->kind == K_CACHED) {
        /* dead: held, not usable, counted in reserved only; cached: checked above */
      } else if (b->kind == K_PHANTOM) {
        if (!b->stitch || !b->stitch->user) FAIL("a phantom block lends to no live stitched block");
      } else if (!count_user(s, &n, block_small(b) ? STASH_STAT_SMALL : STASH_STAT_LARGE, b,
                             &live)) {
        FAIL("a live block is not in the map");
      } else {
        size_t lo = (size_t)(b->ptr - a->base) / G, hi = (size_t)(b->ptr + b->size - a->base + G - 1) / G;
        for (size_t k = _stash_sb_handle_after(a, lo);
             k < a->nhandles && a->handles[k].first_page < hi; k++)
          if (a->handles[k].access != H_READY) FAIL("a live block on memory not mapped at 0x%" PRIx64, b->ptr);
      }
    }
    if (expect != a->base + a->mapped) FAIL("blocks do not span an arena");
    if (nvoid != a->nreleased) FAIL("a void block where no memory was given back");
    if (a->last && a->last->next) FAIL("an arena's last block is not last");
    if (nfree != a->by_addr.count || nfree != nsize) FAIL("the free sets are out of date");
    if (free_sum != a->free_bytes)
      FAIL("an arena counts %zu free bytes, holds %zu", a->free_bytes, free_sum);
  }
  for (sb_stitch* x = s->stitches; x; x = x->next_st) {
    if (x->offset >= x->lent_end || x->lent_end > x->npages * G || x->offset % kMinBlock)
      FAIL("a stitched range lends a bad span");
    {
      size_t nsmall = s->arenas[0].mapped / G, npg = nsmall + s->arenas[1].mapped / G;
      uint8_t* seen = calloc(npg / 8 + 1, 1); /* the small arena's pages, then the large's */
      if (!seen) return _stash_error(STASH_ERR_HOST_OOM, "check: out of host memory");
      bool twice = false, outside = false, small = false;
      for (size_t i = 0; i < x->npages; i++) {
        size_t pg = home_page(x->homes[i]);
        small |= (x->homes[i] & kSmallHome) != 0;
        if (pg >= home_arena(s, x->homes[i])->mapped / G) {
          outside = true;
          break;
        }
        if (!(x->homes[i] & kSmallHome)) pg += nsmall;
        twice |= (seen[pg / 8] >> (pg % 8)) & 1;
        seen[pg / 8] |= (uint8_t)(1u << (pg % 8));
      }
      free(seen);
      if (small != x->small_homes) FAIL("a stitched range misremembers its small-arena pages");
      if (outside) FAIL("a stitched range maps a page outside the arena");
      if (twice) FAIL("a stitched range maps a page twice");
    }
    if (x->user) {
      sb_block* u = x->user;
      if (u->kind != K_USER || u->stitch != x || u->ptr != x->va + x->offset ||
          x->offset + u->size > x->lent_end)
        FAIL("a bad stitched block");
      if (!count_user(s, &n, STASH_STAT_LARGE, u, &live)) FAIL("a live block is not in the map");
      /* all it lends lies in its phantoms (one per run of pages, or several side by side
       * where the run's memory lay in several free blocks) */
      bool carved = true;
      FOR_LENT(s, x, {
        sb_block* b = run_arena->first;
        while (b && b->ptr + b->size <= run_at) b = b->next;
        for (uint64_t at = run_at; at < run_at + run_len; b = b->next) {
          if (!b || b->kind != K_PHANTOM || b->stitch != x || b->ptr > at) {
            carved = false;
            break;
          }
          at = b->ptr + b->size;
        }
      });
      if (!carved) FAIL("lent memory is not carved out of the arena");
    }
  }
  for (int k = 0; k < 2; k++) { /* the pages that ranges map, counted as the ranges say */
    const sb_arena* a = &s->arenas[k];
    uint32_t mark = a->small ? kSmallHome : 0;
    uint32_t* want = calloc(a->cap_ranged ? a->cap_ranged : 1, sizeof *want);
    if (!want) return _stash_error(STASH_ERR_HOST_OOM, "heap check: out of host memory");
    bool wrong = false;
    for (sb_stitch* x = s->stitches; x; x = x->next_st)
      for (size_t i = 0; i < x->npages; i++) {
        if ((x->homes[i] & kSmallHome) != mark) continue;
        size_t p = home_page(x->homes[i]);
        if (p < a->cap_ranged) want[p]++;
        else wrong = true;
      }
    size_t pages = 0;
    for (size_t p = 0; p < a->cap_ranged; p++) {
      wrong |= want[p] != a->ranged[p];
      pages += a->ranged[p] != 0;
    }
    free(want);
    if (wrong || pages != a->nranged)
      FAIL("the counts of %s-arena pages in stitched ranges are out of date",
           a->small ? "small" : "large");
  }
  if (live != s->allocated.count) FAIL("the address map holds stale entries");
  if (total != h->total_reserved) FAIL("total reserved %zu != %zu", h->total_reserved, total);
  const stash_stats_t* st = &h->stats;
  stash_status_t r = _stash_stats_check(st, &n);
  if (r != STASH_OK) return r;
  pending_t pending = {false, 0};
  _stash_events_foreach(&s->events, pending_ok, &pending);
  if (pending.bad) FAIL("an event waits on a block that is not pending");
  if ((size_t)(pending.blocks + 0.5) != s->pending_uses)
    FAIL("%zu blocks counted as waiting for record_stream's events, %.0f waiting",
         s->pending_uses, pending.blocks);
  return STASH_OK;
}
