/* policy_stash_stitch.c: policy:stash's stitched ranges - a fresh virtual range mapped onto
 * physical allocations of the arenas that are wholly free right now (the large arena's
 * holes, the small arena, the large arena's free end), starting in the free end of a partly
 * free allocation (a head) and ending in the free start of another (a tail) where that saves
 * new memory, with new memory (policy_stash_arena.c) for the rest; lent to its block as
 * phantom blocks of the arenas while the block lives, given back to them when it is freed,
 * kept mapped to serve a later block of a similar size, unmapped by empty_cache. Whether a
 * request may be stitched at all is for policy_stash.c to say (try_alloc; the rules are in
 * its header); stitch_alloc decides whether the holes give enough, and makes the range.
 *
 * Called by policy_stash.c; calls policy_stash_arena.c.
 *
 * Synchronization: every function here runs under the heap's lock (heap.c).
 */
#include <stdlib.h>
#include <string.h>

#include "policy_stash_blocks.h"

/* ---- Stitching -------------------------------------------------------------------------------- */

/* Runs of consecutive home pages (of one arena): the body sees run_first (a home) and
 * run_pages. */
#define FOR_RUNS(st, ...)                                                     \
  for (size_t i_ = 0; i_ < (st)->npages;) {                                    \
    size_t j_ = i_ + 1;                                                        \
    while (j_ < (st)->npages && (st)->homes[j_] == (st)->homes[j_ - 1] + 1) j_++; \
    size_t run_first = (st)->homes[i_], run_pages = j_ - i_;                   \
    __VA_ARGS__;                                                               \
    i_ = j_;                                                                   \
  }

/* The free blocks that [at, at + len) of arena a lies in, walked with `b` (the free block at
 * `at` first; NULL where the memory is not free): one, or several side by side where a block
 * another stream freed lies apart from its untagged neighbours (tags_merge). */
#define FOR_FREE_IN(a, at, len, ...)                                                       \
  for (uint64_t p_ = (at); p_ < (at) + (len);) {                                          \
    sb_block* b = free_containing((a), p_, 1);                                            \
    __VA_ARGS__;                                                                          \
    if (!b) break;                                                                        \
    p_ = b->ptr + b->size;                                                                \
  }

/* Whether all the memory st lends is free for stream slot `slot` now. */
bool _stash_sb_stitch_available(stash_heap_t* h, const sb_stitch* st, uint32_t slot) {
  bool ok = true;
  FOR_LENT(S(h), st, {
    FOR_FREE_IN(run_arena, run_at, run_len, {
      if (!b || !tag_ok(b, slot)) ok = false;
    });
  });
  return ok;
}

/* The longest run [*lo, *hi) of st's range whose memory in its arenas is free for
 * stream slot `slot` now (to 512 bytes): where blocks have since taken an edge of a cached
 * range's span, its block may still fit a little further along. */
static void stitch_free_run(stash_heap_t* h, const sb_stitch* st, uint32_t slot, size_t* lo,
                            size_t* hi) {
  size_t best_lo = 0, best_hi = 0, run_lo = 0;
  bool in = false;
  for (size_t p = 0; p < st->npages; p++) {
    sb_arena* a = home_arena(S(h), st->homes[p]);
    uint64_t at = a->base + (uint64_t)home_page(st->homes[p]) * G;
    size_t r = p * G;
    sb_block* f = free_containing(a, at, 1); /* the free block holding the page's first byte */
    if (f && !tag_ok(f, slot)) f = NULL;
    if (f && f->ptr + f->size >= at + G) { /* the whole page */
      if (!in) run_lo = r;
      in = true;
      continue;
    }
    if (in) { /* the run ends in this page */
      size_t end = r + (f ? (size_t)(f->ptr + f->size - at) : 0);
      if (end - run_lo > best_hi - best_lo) best_lo = run_lo, best_hi = end;
      in = false;
    }
    sb_block* l = free_containing(a, at + G - kMinBlock, kMinBlock); /* and its last bytes */
    if (l && tag_ok(l, slot) && l->ptr > at) {
      in = true;
      run_lo = r + (size_t)(l->ptr - at);
    }
  }
  if (in && st->npages * G - run_lo > best_hi - best_lo) best_lo = run_lo, best_hi = st->npages * G;
  *lo = best_lo;
  *hi = best_hi;
}

static size_t stitch_runs(stash_heap_t* h, const sb_stitch* st) {
  size_t n = 0;
  FOR_LENT(S(h), st, { FOR_FREE_IN(run_arena, run_at, run_len, { n++; }); });
  return n;
}

/* Lend st's home pages: carve them out of their arenas as phantom blocks. Host memory
 * for the metadata is taken first; the pages must be free (stitch_available). */
stash_status_t _stash_sb_stitch_lend(stash_heap_t* h, sb_stitch* st) {
  sb_state* s = S(h);
  size_t runs = stitch_runs(h, st);
  sb_block* spare[3 * 64];
  sb_block** meta = runs <= 64 ? spare : malloc(3 * runs * sizeof *meta);
  if (!meta) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  for (size_t i = 0; i < 3 * runs; i++) {
    meta[i] = block_new(s);
    if (!meta[i]) {
      for (size_t j = 0; j < i; j++) block_delete(s, meta[j]);
      if (meta != spare) free(meta);
      return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    }
  }
  size_t r = 0;
  st->phantoms = NULL;
  FOR_LENT(s, st, {
    FOR_FREE_IN(run_arena, run_at, run_len, {
      uint64_t end = b->ptr + b->size < run_at + run_len ? b->ptr + b->size : run_at + run_len;
      uint64_t at = p_;
      sb_block* ph = carve(s, b, at, end - at, meta[3 * r], meta[3 * r + 1]);
      block_delete(s, meta[3 * r + 2]);
      ph->kind = K_PHANTOM;
      ph->stitch = st;
      ph->tnext = st->phantoms;
      st->phantoms = ph;
      r++;
      b = ph; /* the walk goes on after the piece carved */
    });
  });
  if (meta != spare) free(meta);
  return STASH_OK;
}

/* Whether phantom a comes before b: the small arena's first, then by address (the order in
 * which a walk of the arenas would meet them). */
static bool phantom_before(const sb_block* a, const sb_block* b) {
  if (a->arena->small != b->arena->small) return a->arena->small;
  return a->ptr < b->ptr;
}

/* A list of phantoms (linked by tnext) in that order: a merge sort of the list itself, so
 * that taking the pages back needs no host memory. */
static sb_block* phantoms_sorted(sb_block* list) {
  if (!list || !list->tnext) return list;
  sb_block *slow = list, *fast = list->tnext;
  while (fast && fast->tnext) {
    slow = slow->tnext;
    fast = fast->tnext->tnext;
  }
  sb_block* b = phantoms_sorted(slow->tnext);
  slow->tnext = NULL;
  sb_block* a = phantoms_sorted(list);
  sb_block* out = NULL;
  sb_block** tail = &out;
  while (a && b) {
    sb_block** from = phantom_before(b, a) ? &b : &a;
    *tail = *from;
    *from = (*from)->tnext;
    tail = &(*tail)->tnext;
  }
  *tail = a ? a : b;
  return out;
}

/* Take the pages back: the phantoms become free blocks tagged with the stream that used
 * the stitched block - in the arenas' order, as a walk of them would (a merge's outcome may
 * depend on the order). */
void _stash_sb_stitch_return(stash_heap_t* h, sb_stitch* st, uint32_t tag, uint64_t epoch) {
  sb_state* s = S(h);
  sb_block* b = phantoms_sorted(st->phantoms);
  st->phantoms = NULL;
  while (b) {
    sb_block* next = b->tnext; /* a phantom still: no merge takes it */
    b->tnext = NULL;
    b->kind = K_FREE;
    b->stitch = NULL;
    b->tag = tag;
    b->epoch = epoch;
    free_coalesce(s, b);
    b = next;
  }
}

/* Map st's home pages at st->va, one map call per run within one physical allocation. */
static stash_status_t stitch_map(stash_heap_t* h, sb_stitch* st) {
  size_t done = 0; /* pages mapped so far */
  stash_status_t err = STASH_OK;
  FOR_RUNS(st, {
    sb_arena* a = home_arena(S(h), run_first);
    size_t p = home_page(run_first), left = run_pages;
    while (left && err == STASH_OK) {
      sb_handle* hd = &a->handles[_stash_sb_handle_after(a, p)];
      size_t in = hd->first_page + hd->npages - p;
      size_t n = left < in ? left : in;
      err = PCALL(h, map, h->device, st->va + done * G, n * G, hd->handle,
                  (p - hd->first_page) * G);
      if (err != STASH_OK) {
        err = prov_fail(h, err, "map pages into a stitched range");
        break;
      }
      done += n;
      p += n;
      left -= n;
    }
  });
  if (err == STASH_OK) {
    err = PCALL(h, set_access, h->device, st->va, st->npages * G);
    if (err != STASH_OK) err = prov_fail(h, err, "set access to a stitched range");
  }
  if (err != STASH_OK && done && PCALL(h, unmap, h->device, st->va, done * G) != STASH_OK)
    _stash_zombies_add(&S(h)->zombies, st->va, done * G, 0);
  return err;
}

/* Count st's pages in (delta 1) or out (delta -1) of their arenas' `ranged` counts. */
static stash_status_t ranged_add(sb_state* s, const sb_stitch* st, int delta) {
  size_t top[2] = {0, 0}; /* per arena: one past the range's highest page there */
  if (delta > 0) /* (a range counted before has its room) */
    for (size_t i = 0; i < st->npages; i++) {
      size_t* t = &top[home_arena(s, st->homes[i]) == &s->arenas[0] ? 0 : 1];
      if (home_page(st->homes[i]) + 1 > *t) *t = home_page(st->homes[i]) + 1;
    }
  for (int k = 0; k < 2; k++) { /* room first: nothing is counted on a failure */
    sb_arena* a = &s->arenas[k];
    if (top[k] <= a->cap_ranged) continue;
    size_t cap = a->cap_ranged;
    uint32_t* v = _stash_array_grow(a->ranged, &cap, top[k], sizeof *v, 64);
    if (!v) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    memset(v + a->cap_ranged, 0, (cap - a->cap_ranged) * sizeof *v);
    a->ranged = v;
    a->cap_ranged = cap;
  }
  for (size_t i = 0; i < st->npages; i++) {
    sb_arena* a = home_arena(s, st->homes[i]);
    size_t p = home_page(st->homes[i]);
    if (delta > 0 && a->ranged[p]++ == 0) a->nranged++;
    if (delta < 0 && --a->ranged[p] == 0) a->nranged--;
  }
  return STASH_OK;
}

static void stitch_unlink(sb_state* s, sb_stitch* st) {
  if (st->prev_st) st->prev_st->next_st = st->next_st;
  else s->stitches = st->next_st;
  if (st->next_st) st->next_st->prev_st = st->prev_st;
}

/* Unmap a free stitched range and forget it. */
stash_status_t _stash_sb_stitch_release(stash_heap_t* h, sb_stitch* st) {
  sb_state* s = S(h);
  stash_status_t r = PCALL(h, unmap, h->device, st->va, st->npages * G);
  if (r != STASH_OK) return prov_fail(h, r, "unmap a stitched range");
  ranged_add(s, st, -1); /* only decrements: cannot fail */
  stitch_unlink(s, st);
  free(st->homes);
  free(st);
  h->stats.num_device_free++;
  return STASH_OK;
}

/* The physical allocations lying wholly inside block b of arena a (of heap h): from the
 * returned index on, while whole_handle_in(a, i, *hi) - they are consecutive in a->handles. */
static size_t whole_handles_from(const stash_heap_t* h, const sb_arena* a, const sb_block* b,
                                 size_t* hi) {
  size_t lo = (size_t)(b->ptr - a->base + G - 1) / G;
  *hi = (size_t)(b->ptr + b->size - a->base) / G;
  size_t i = _stash_sb_handle_after(a, lo); /* the one holding page lo, or the first after it ... */
  if (i < a->nhandles && a->handles[i].first_page < lo) i++; /* ... starting at or after lo */
  return i;
}

static bool whole_handle_in(const sb_arena* a, size_t i, size_t hi) {
  return i < a->nhandles && a->handles[i].first_page + a->handles[i].npages <= hi;
}

/* Take into homes (from *got on) the pages of the physical allocations lying wholly inside
 * free block b (of either arena), as long as they fit in n. */
static void take_whole_handles(stash_heap_t* h, const sb_block* b, size_t n, uint32_t* homes,
                               size_t* got) {
  const sb_arena* a = b->arena;
  uint32_t mark = a->small ? kSmallHome : 0;
  size_t hi = 0;
  for (size_t i = whole_handles_from(h, a, b, &hi); whole_handle_in(a, i, hi) && *got < n; i++) {
    const sb_handle* x = &a->handles[i];
    if (*got + x->npages > n) continue;
    for (size_t p = 0; p < x->npages; p++) homes[(*got)++] = (uint32_t)(x->first_page + p) | mark;
  }
}

/* The pages of whole free physical allocations in the large arena's holes (not its free
 * end), largest hole first, into homes: at most n; returns how many. */
static size_t stitch_from_holes(stash_heap_t* h, uint32_t slot, size_t n, uint32_t* homes) {
  sb_arena* a = &S(h)->arenas[1];
  size_t got = 0;
  bs_node_t* it[2] = {_stash_bs_last(&a->by_size[0]),
                      slot ? _stash_bs_last(&a->by_size[slot]) : NULL};
  while (got < n && (it[0] || it[1])) {
    int w = !it[0] ? 1 : !it[1] ? 0 : (cmp_size(it[0], it[1]) > 0 ? 0 : 1);
    sb_block* b = FROM_SNODE(it[w]);
    it[w] = _stash_bs_prev(it[w]);
    if (b->size < kStitchMinRun) break; /* the rest are smaller */
    if (b != a->last) take_whole_handles(h, b, n, homes, &got);
  }
  return got;
}

/* The pages of whole free physical allocations of the small arena, from its end down, into
 * homes: at most n; returns how many. Small requests peak at other times than large ones
 * (an optimizer's step against the forward pass): the small arena's free memory at a large
 * peak serves a stitched range instead of lying idle, and is back for the small requests
 * when the stitched block is freed. */
static size_t stitch_from_small(stash_heap_t* h, uint32_t slot, size_t n, uint32_t* homes) {
  size_t got = 0;
  for (sb_block* b = S(h)->arenas[0].last; b && got < n; b = b->prev)
    if (b->kind == K_FREE && tag_ok(b, slot) && b->size >= G) take_whole_handles(h, b, n, homes, &got);
  return got;
}

/* Whole free physical allocations for a new stitched range, into homes: the large arena's
 * holes', then the small arena's; at most n; returns how many. */
static size_t stitch_from_free(stash_heap_t* h, uint32_t slot, size_t n, uint32_t* homes) {
  size_t got = stitch_from_holes(h, slot, n, homes);
  if (got < n) got += stitch_from_small(h, slot, n - got, homes + got);
  return got;
}

/* Complete the pages of a new stitched range of n pages, homes[0, got) taken from the holes:
 * whole free allocations at the large arena's free end, then new allocations for the rest;
 * then sort them. New memory is mapped at its arena address only when the arena first uses
 * it (arena_ready): a logits range's hundreds of MiB may never be. Less than the arena's
 * smallest growth (kLargeGrowBytes) is mapped there at once, as a growth of the arena would
 * be: a block landing on it later would otherwise map it then, a driver call in what may be a
 * training loop's steady state (eleventh/swin_t_b80: a 4 MiB allocation readied for a 132 MiB
 * block in the second half; docs/policy-stash.md, "Twenty-fifth session") - except once the
 * heap is tight: at its device's limit the pressed ranges' small new memory is as often never
 * used by the arena (tools/fill_price.py: 4 more calls in bert_varlen_train's second half).
 * Also, up to kLargePieceMax, once the arena has grown at once to a step's predicted peak
 * (sb_alloc, fate.c): a range's new memory is then what the prediction missed, at the top of
 * an arena whose blocks already fill it, and the step's blocks drift onto it steps later -
 * ninth/t5_base_b18's 20 MiB, made for its second step's last logits and readied for a 13.5
 * MiB block in its second half (a map and a cuMemSetAccess in the steady state). Larger new
 * memory (a logits range's hundreds of MiB) stays lazy: without the cap, 4 more traces pay
 * the access calls and none gains. */
static stash_status_t stitch_pick(stash_heap_t* h, uint32_t slot, size_t n, size_t got,
                                  uint32_t* homes) {
  sb_state* s = S(h);
  sb_arena* a = &s->arenas[1];
  sb_block* t = a->last;
  if (got < n && t && t->kind == K_FREE && tag_ok(t, slot)) take_whole_handles(h, t, n, homes, &got);
  if (got < n) {
    size_t first = a->mapped / G, fresh = (n - got) * G;
    bool mapped_now = fresh < kLargeGrowBytes || (s->grown_to_peak && fresh <= kLargePieceMax);
    stash_status_t st = _stash_sb_arena_grow(
        h, a, n - got, slot, true, piece_bytes(n * G, kStitchPiece, kStitchPieces, G),
        !mapped_now || s->tight);
    if (st != STASH_OK) return st;
    for (size_t p = first; got < n; p++) homes[got++] = (uint32_t)p;
  }
  /* ascending, for runs */
  for (size_t i = 1; i < n; i++) {
    uint32_t v = homes[i];
    size_t j = i;
    while (j > 0 && homes[j - 1] > v) {
      homes[j] = homes[j - 1];
      j--;
    }
    homes[j] = v;
  }
  return STASH_OK;
}

/* A physical allocation only partly free that can still start or end a stitched range:
 * under the start of a free block, one that begins before the block and ends inside it (its
 * free part: from the block's start to its end); or under a free block's end, one that
 * begins inside the block and ends after it (from its start to the block's end). */
typedef struct sb_edge_s {
  bool found;
  size_t handle; /* index in the large arena's allocations */
  size_t bytes;  /* its free part */
} sb_edge;

/* The edge allocation with the largest free part (at least `least` bytes) among the large
 * arena's free blocks usable by stream slot `slot`: a head (start) or a tail (end), not
 * allocation `other`. */
static sb_edge stitch_edge(stash_heap_t* h, uint32_t slot, bool head, size_t other,
                           size_t least) {
  sb_arena* a = &S(h)->arenas[1];
  sb_edge best = {false, 0, 0};
  for (sb_block* b = a->first; b; b = b->next) {
    if (b->kind != K_FREE || !tag_ok(b, slot) || b->size < least) continue;
    uint64_t end = b->ptr + b->size;
    size_t i = _stash_sb_handle_after(a, (size_t)((head ? b->ptr : end - 1) - a->base) / G);
    if (i >= a->nhandles || i == other) continue;
    uint64_t hs = a->base + a->handles[i].first_page * G, he = hs + a->handles[i].npages * G;
    size_t bytes = 0;
    if (head && hs < b->ptr && he <= end) bytes = (size_t)(he - b->ptr);
    if (!head && hs >= b->ptr && he > end) bytes = (size_t)(end - hs);
    if (bytes >= least && bytes > best.bytes) best = (sb_edge){true, i, bytes};
  }
  return best;
}

/* The largest head of the large arena and the largest tail in another allocation, of at
 * least kStitchMinRun each - or, for a request under kStitchEdgeMin not pressed, of at least
 * kStitchSmallEdge, and none if `cached` (a free range that would hold it exists). */
static void stitch_edges(stash_heap_t* h, uint32_t slot, size_t size, bool pressed, bool cached,
                         sb_edge* hd, sb_edge* tl) {
  *hd = *tl = (sb_edge){false, 0, 0};
  bool small = size < kStitchEdgeMin && !pressed;
  if (small && cached) return;
  size_t least = small ? kStitchSmallEdge : kStitchMinRun;
  *hd = stitch_edge(h, slot, true, SIZE_MAX, least);
  *tl = stitch_edge(h, slot, false, hd->found ? hd->handle : SIZE_MAX, least);
}

/* The whole free allocations the holes give a new range of `size` bytes after a head of
 * head_b bytes (stitch_from_free): their first pages, in a buffer of their own that the caller
 * frees (taken), and how many (got). Without host memory for the buffer, taken is NULL and
 * got 0. Counted once per range for both tails below. */
typedef struct sb_holes_s {
  uint32_t* taken;
  size_t got;
} sb_holes;

static sb_holes holes_give(stash_heap_t* h, uint32_t slot, size_t size, size_t head_b) {
  size_t n = (size - head_b) / G;
  sb_holes g = {malloc((n ? n : 1) * sizeof(uint32_t)), 0};
  if (g.taken) g.got = stitch_from_free(h, slot, n, g.taken);
  return g;
}

/* For a new range that would otherwise take new memory after a head of head_b bytes: the
 * largest physical allocation lying wholly in the large arena's free end, as its tail, when
 * the holes' whole allocations and it cover the rest of `size` - so no new memory is made.
 * The range then ends inside that allocation: the block uses only the start of it that the
 * head and the holes leave (the tail's bytes), and the rest stays free in the arena. An
 * allocation larger than what is missing is otherwise never taken (only whole ones that fit
 * the count), and the range would map new memory beside a free one that could have served
 * it. Not taken when a tail found elsewhere is as large. (Without host memory to count the
 * holes' pages, no such tail: the range takes new memory, as it would have.) */
static sb_edge stitch_end_tail(stash_heap_t* h, uint32_t slot, size_t size, size_t head_b,
                               const sb_holes* given, const sb_edge* tail) {
  sb_arena* a = &S(h)->arenas[1];
  sb_edge none = {false, 0, 0};
  const sb_block* t = a->last;
  if (!t || t->kind != K_FREE || !tag_ok(t, slot)) return none;
  size_t hi = 0, best = SIZE_MAX, bytes = 0;
  for (size_t i = whole_handles_from(h, a, t, &hi); whole_handle_in(a, i, hi); i++)
    if (a->handles[i].npages * G > bytes) best = i, bytes = a->handles[i].npages * G;
  if (best == SIZE_MAX || (tail->found && bytes <= tail->bytes)) return none;
  if (!given->taken) return none;
  size_t holes = given->got * G;
  if (head_b + holes >= size || head_b + holes + bytes < size) return none;
  return (sb_edge){true, best, size - head_b - holes};
}

/* For a new range that would otherwise take new memory, or (cover_only) grow the arena: the
 * smallest physical allocation lying wholly in a hole of the large arena (not its free end,
 * stitch_end_tail's) that the holes' whole allocations do not take and that is larger than
 * what they and the head of head_b bytes leave of `size` - as the range's tail, so no new
 * memory is made. The range maps it whole and its block ends inside it; the rest stays free in
 * the arena. The range then takes the same whole allocations of the holes (stitch_from_free
 * takes the largest that fit the count, and the count is what they gave), never this one (it
 * did not fit then). VGG's later steps, whose ranges took new memory beside such allocations:
 * 10-65 MB less reserved and 9-38% less driver time (docs/policy-stash.md, "Thirty-second
 * session"). `given`: holes_give's count for this size and head. */
static sb_edge stitch_hole_tail(stash_heap_t* h, uint32_t slot, size_t size, size_t head_b,
                                const sb_holes* given) {
  sb_arena* a = &S(h)->arenas[1];
  sb_edge none = {false, 0, 0};
  size_t got = given->got;
  if (!given->taken) return none; /* no such tail: new memory, as before */
  if (head_b + got * G >= size) return none;
  size_t missing = size - head_b - got * G, best = SIZE_MAX, bytes = SIZE_MAX;
  for (bs_node_t* nd = _stash_bs_first(&a->by_addr); nd; nd = _stash_bs_next(nd)) {
    const sb_block* b = FROM_ANODE(nd);
    if (b == a->last || !tag_ok(b, slot)) continue;
    size_t hi = 0;
    for (size_t i = whole_handles_from(h, a, b, &hi); whole_handle_in(a, i, hi); i++) {
      size_t nb = a->handles[i].npages * G;
      if (nb <= missing || nb >= bytes) continue;
      bool in = false;
      for (size_t k = 0; k < got && !in; k++)
        in = given->taken[k] == (uint32_t)a->handles[i].first_page;
      if (!in) best = i, bytes = nb;
    }
  }
  return best == SIZE_MAX ? none : (sb_edge){true, best, missing};
}

/* A tail found in a partly free allocation (stitch_edges), cut to what the head of head_b
 * bytes and the holes' whole allocations (`holes` bytes, as holes_give counted them;
 * SIZE_MAX: not counted) leave of `size` - none when they cover it. The range's middle is the
 * room the head and the tail leave, filled with whole allocations of the holes (largest hole
 * first, skipping one that does not fit the room); a tail larger than needed makes the room
 * smaller, and a whole allocation that would have fitted is then skipped for new memory:
 * loops2/llama_b8_frozen's 26.6 MiB tail left a free 192 MiB allocation out and grew 180 MiB.
 * Not in a heap turned tight: at the device's limit it moved 27 traces' smallest device both
 * ways (ninth/vgg16_b48 12 MiB larger, one more trace needing more than expandable segments;
 * docs/policy-stash.md, "Thirty-fifth session"). */
static sb_edge stitch_trim_tail(stash_heap_t* h, size_t size, size_t head_b, size_t holes,
                                sb_edge tail) {
  /* without host memory to count the holes' allocations, the tail as found */
  if (!tail.found || S(h)->tight || holes == SIZE_MAX) return tail;
  if (head_b + holes >= size) return (sb_edge){false, 0, 0};
  if (head_b + holes + tail.bytes > size) tail.bytes = size - head_b - holes;
  return tail;
}

/* Whether live bytes are at their peak so far (within a thousandth of it): nothing much has
 * been freed since they last rose, as in a first forward pass climbing to its peak. */
static bool climbing(stash_heap_t* h) {
  return h->stats.allocated_bytes[STASH_STAT_ALL].current * 1000 >= S(h)->live_peak * 999;
}

/* A stitched block for `size` bytes: a free stitched range of a similar size whose pages are
 * free, else a new one if the holes give enough of it (`cover_only`: if whole free allocations
 * cover all of it, with no new memory; `pressed`: whatever share they give); else *out = NULL:
 * grow the arena. */
stash_status_t _stash_sb_stitch_alloc(stash_heap_t* h, size_t size, uint32_t slot, bool cover_only,
                                      bool pressed, sb_stitch** out) {
  sb_state* s = S(h);
  sb_arena* a = &s->arenas[1];
  sb_stitch* best = NULL;
  bool cached = false; /* a free range that would hold it, but not free as it was */
  for (sb_stitch* st = s->stitches; st; st = st->next_st) {
    if (!range_holds(h, st, size)) continue;
    cached = true;
    if (best && st->lent_end - st->offset >= best->lent_end - best->offset) continue;
    if (_stash_sb_stitch_available(h, st, slot)) best = st;
  }
  for (sb_stitch* st = s->stitches; st && !best; st = st->next_st) {
    /* none free as it was: one whose block fits further along (its span moved) */
    size_t lo = 0, hi = 0, offset = st->offset, lent_end = st->lent_end;
    if (st->user || st->npages * G < size || st->npages * G > 2 * size + 2 * G) continue;
    stitch_free_run(h, st, slot, &lo, &hi);
    if (hi - lo < size) continue;
    st->offset = lo;
    st->lent_end = lo + size;
    if (_stash_sb_stitch_available(h, st, slot)) {
      best = st;
    } else {
      st->offset = offset;
      st->lent_end = lent_end;
    }
  }
  if (best) {
    stash_status_t r = _stash_sb_stitch_lend(h, best);
    if (r != STASH_OK) return r;
    *out = best;
    return STASH_OK;
  }
  /* A new range: whole free allocations from the holes, then from the arena's free end, then
   * new ones. When it would take new memory, it may start with the free end of a partly free
   * allocation (a head) and end in the free start of another (a tail), to take less: the
   * block runs from the head's free part to within the tail's (stitch_edges: how large). */
  size_t need = (size + G - 1) / G;
  uint32_t* homes = malloc(need * sizeof *homes);
  if (!homes) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  size_t got = stitch_from_free(h, slot, need, homes);
  sb_edge hd = {false, 0, 0}, tl = {false, 0, 0}; /* the best head, and a tail elsewhere */
  bool edges_known = false; /* looked for */
  if (!cover_only && !pressed && got < (need + kStitchHoleShare - 1) / kStitchHoleShare) {
    stitch_edges(h, slot, size, pressed, cached, &hd, &tl);
    edges_known = true;
    size_t edges = (hd.found && hd.bytes < size ? hd.bytes : 0) + (tl.found ? tl.bytes : 0);
    /* in the first forward pass, less than half: grow instead (every byte grown there is
     * needed at the peak the pass climbs to; a range would only add its pieces' access calls);
     * once live bytes have first fallen to half their peak, less than a twentieth, less a
     * page (docs/policy-stash.md, "Twenty-eighth session" and "Thirtieth session") - but half
     * still in a tight heap, which needs a smaller device so; and three quarters (kClimbPct)
     * while a first pass climbs */
    size_t share = s->dropped && !s->tight ? (size_t)kStitchEdgeShare : 2;
    if (share * (got * G + edges + (s->dropped ? G : 0)) < size ||
        (!s->dropped && climbing(h) && (got * G + edges) * 100 < size * kClimbPct)) {
      free(homes);
      *out = NULL;
      return STASH_OK;
    }
  }
  size_t at_end = got;
  if (a->last && a->last->kind == K_FREE && tag_ok(a->last, slot))
    take_whole_handles(h, a->last, need, homes, &at_end);
  if (at_end >= need) {
    hd.found = tl.found = false; /* no new memory: no head or tail either */
  } else if (cover_only) { /* free memory covers it with a tail in a hole, or grow instead */
    sb_holes given = holes_give(h, slot, size, 0); /* no head: edges are not looked for here */
    tl = stitch_hole_tail(h, slot, size, 0, &given);
    free(given.taken);
    if (!tl.found) {
      free(homes);
      *out = NULL;
      return STASH_OK;
    }
  } else {
    if (!edges_known) stitch_edges(h, slot, size, pressed, cached, &hd, &tl);
    if (hd.found && hd.bytes >= size) hd.found = false; /* best fit would have fitted */
    if (tl.found && (hd.found ? hd.bytes : 0) + tl.bytes >= size + G) tl.found = false;
    size_t head_b = hd.found ? hd.bytes : 0;
    sb_holes given = holes_give(h, slot, size, head_b);
    sb_edge end = stitch_end_tail(h, slot, size, head_b, &given, &tl);
    if (end.found) {
      tl = end;
    } else {
      sb_edge hole = stitch_hole_tail(h, slot, size, head_b, &given);
      tl = hole.found ? hole
                      : stitch_trim_tail(h, size, head_b, given.taken ? given.got * G : SIZE_MAX, tl);
    }
    free(given.taken);
  }
  size_t head_b = hd.found ? hd.bytes : 0, tail_b = tl.found ? tl.bytes : 0;
  size_t lead = hd.found ? a->handles[hd.handle].npages : 0;
  size_t trail = tl.found ? a->handles[tl.handle].npages : 0;
  size_t mid = (size - head_b - (tail_b < size - head_b ? tail_b : size - head_b) + G - 1) / G;
  size_t n = lead + mid + trail;
  sb_stitch* st = calloc(1, sizeof *st);
  if (st) st->id = ++s->stitch_ids;
  uint32_t* all = n > need ? realloc(homes, n * sizeof *homes) : homes;
  if (!st || !all) {
    free(st);
    free(all ? all : homes);
    return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  }
  homes = all;
  if (lead || trail) got = stitch_from_free(h, slot, mid, homes + lead); /* fewer, shifted */
  for (size_t p = 0; p < lead; p++) homes[p] = (uint32_t)(a->handles[hd.handle].first_page + p);
  for (size_t p = 0; p < trail; p++)
    homes[lead + mid + p] = (uint32_t)(a->handles[tl.handle].first_page + p);
  st->homes = homes;
  st->npages = n;
  st->page = G;
  st->offset = lead * G - head_b;
  st->lent_end = trail ? st->offset + size : n * G;
  stash_status_t r = STASH_OK;
  if (s->stitch_va + n * G > s->stitch_va_end) {
    size_t span = round_up(4 * h->device_total, G);
    if (span < 2 * n * G) span = round_up(2 * n * G, G);
    r = _stash_sb_va_reserve(h, span, &s->stitch_va);
    if (r == STASH_OK) s->stitch_va_end = s->stitch_va + span;
  }
  if (r == STASH_OK) r = stitch_pick(h, slot, mid, got, homes + lead);
  for (size_t p = 0; r == STASH_OK && p < n; p++) st->small_homes |= (homes[p] & kSmallHome) != 0;
  if (r == STASH_OK) r = ranged_add(s, st, 1);
  bool counted = r == STASH_OK;
  if (r == STASH_OK) {
    st->va = s->stitch_va;
    s->stitch_va += n * G + G; /* taken even if mapping fails: a failed unmap may hold it */
    r = stitch_map(h, st);
  }
  if (r == STASH_OK) {
    r = _stash_sb_stitch_lend(h, st);
    if (r != STASH_OK && PCALL(h, unmap, h->device, st->va, n * G) != STASH_OK)
      _stash_zombies_add(&S(h)->zombies, st->va, n * G, 0);
  }
  if (r != STASH_OK) {
    /* Pages picked from holes are still free; a mapping made is undone by stitch_map. */
    if (counted) ranged_add(s, st, -1);
    free(homes);
    free(st);
    return r;
  }
  st->next_st = s->stitches;
  if (s->stitches) s->stitches->prev_st = st;
  s->stitches = st;
  h->stats.num_device_alloc++;
  *out = st;
  return STASH_OK;
}
