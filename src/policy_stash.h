/* policy_stash.h: what the files of policy:stash share - its constants, its types (blocks,
 * arenas, stitched ranges, streams, the heap's state), small helpers, and the functions one
 * file offers the others. Private: not installed. The policy's rules are in the header of
 * policy_stash.c.
 *
 *   policy_stash.c         placement, allocation and free, streams and their epochs, release,
 *                          lifetime, the policy table - the hot path, in one translation unit
 *   policy_stash_blocks.h  blocks and the free sets: inline in every file of the policy
 *   policy_stash_arena.c   the arenas' memory: reserving, growing, shrinking, giving back and
 *                          taking back physical memory
 *   policy_stash_stitch.c  stitched ranges
 *   policy_stash_check.c   introspection: visit and the invariant checker
 *
 * Calls go one way: policy_stash.c -> policy_stash_stitch.c -> policy_stash_arena.c, and
 * policy_stash.c -> policy_stash_check.c -> policy_stash_arena.c. The cold files are called
 * only when memory must grow, be stitched (or a stitched block be served or freed), be given
 * back or be checked; what the allocation path shares with them is static inline (here and
 * in policy_stash_blocks.h), so that the hot path makes no call across files. A function one
 * file offers another is hidden and named _stash_sb_ and its name in the policy (arena_grow:
 * _stash_sb_arena_grow).
 *
 * Synchronization: every function here runs under the heap's lock (heap.c).
 */
#ifndef STASH_POLICY_STASH_H
#define STASH_POLICY_STASH_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* The policy's constants. An experiment build (cmake -DSTASH_POLICY_KNOBS=ON) reads each
 * KNOB_ one from the environment instead, STASH_KNOB_<name>=<positive integer>, whenever it is
 * used: tools/compare_policies.py measures a change of one against every recorded trace. A
 * value that is not a positive integer stops the process there (an experiment must not run
 * on a setting it did not ask for). Other builds compile the constants in. The constants
 * that only policy_stash.c uses are there (kPhaseMinPeak, kQuietShare, kFirstFitTries, and
 * the rule switches kUse...). With STASH_KNOB_ARM set, the settings act in one phase of the
 * run only (policy_stash.c, knob_arm). */
#ifdef STASH_POLICY_KNOBS
extern int _stash_knob_armed;
static inline long long knob(const char* name, long long value) {
  char key[64];
  if (getenv("STASH_KNOB_ARM") && !_stash_knob_armed) return value;
  snprintf(key, sizeof key, "STASH_KNOB_%s", name);
  const char* v = getenv(key);
  if (!v) return value;
  char* end = NULL;
  long long x = strtoll(v, &end, 0);
  if (!*v || *end || x <= 0) {
    fprintf(stderr, "%s=%s: not a positive integer\n", key, v);
    abort();
  }
  return x;
}
#define KNOB_Z(name, value) ((size_t)knob(#name, (long long)(value)))
#define KNOB_I(name, value) ((int)knob(#name, (value)))
#else
#define KNOB_Z(name, value) (value)
#define KNOB_I(name, value) (value)
#endif

#define kMinBlock ((size_t)512)
#define kSmallLimit ((size_t)1 << 20) /* requests up to this go to the small arena */
/* The small arena grows by at least kSmallGrowBytes or, soon after its last growth, by twice
 * that one, up to kSmallBurstMax. */
#define kSmallGrowBytes KNOB_Z(kSmallGrowBytes, (size_t)2 << 20)
#define kSmallBurstMax KNOB_Z(kSmallBurstMax, (size_t)8 << 20)
/* The large arena grows by at least kLargeGrowBytes - but, once live bytes have first fallen
 * to half their peak (in a heap not turned tight), by just what a request lacks when the block
 * it grows for (the free end it extends and the new pages) is kExactGrowFrom or more - in
 * physical allocations of at most
 * kLargePieceMax (fewer pieces cost fewer cuMemSetAccess calls; smaller ones are more often
 * wholly free, for stitching), or of 1/kLargePieces of a request over kLargePieces times
 * kLargePieceMax (1.875 GiB): a huge logits tensor in 10 pieces, not one per 192 MiB - and
 * of 1/kHugePieces of a request of kHugeFrom (3.5 GiB) or more, whose access call costs
 * mostly by the MiB by then - but a
 * request of at most kOnePiecePct percent of kLargePieceMax whose size was among the last
 * kRecentSizes large requests (a layer's tensor, seen before) grows in one piece, not as
 * 192 MiB and a runt. A growth kBurstAllocs or fewer allocations after the last doubles the
 * last one's size, up to kBurstMax (until live bytes first fall to half their peak); while
 * nothing has been freed yet (a model being loaded), every growth doubles the last, up to
 * kLargePieceMax; after the first drop, a growth kRunAllocs or more allocations after the last
 * free (a run that frees nothing: state being made) doubles the last, up to kBurstMax (not
 * in a heap turned tight: at the device's limit it moved mobilenet_v2_b256's smallest device
 * 4 MiB over expandable segments'). No burst, and the burst chain left as it was, when the
 * arena holds at least kBurstMax free bytes and kScatterTimes the request's more than when the
 * last growth was asked for (the free memory is scattered: a burst's end would lie unused at
 * the peak). */
#define kLargeGrowBytes KNOB_Z(kLargeGrowBytes, (size_t)6 << 20)
#define kExactGrowFrom KNOB_Z(kExactGrowFrom, (size_t)12 << 20)
#define kLargePieceMax KNOB_Z(kLargePieceMax, (size_t)192 << 20)
#define kLargePieces KNOB_I(kLargePieces, 10)
#define kBurstAllocs KNOB_Z(kBurstAllocs, (size_t)20)
#define kRunAllocs KNOB_Z(kRunAllocs, (size_t)32)
#define kBurstMax KNOB_Z(kBurstMax, (size_t)64 << 20)
#define kScatterTimes KNOB_Z(kScatterTimes, (size_t)2)
#define kOnePiecePct KNOB_Z(kOnePiecePct, (size_t)400)
#define kHugeFrom KNOB_Z(kHugeFrom, (size_t)7 << 29)
#define kHugePieces KNOB_I(kHugePieces, 5)
#define kRecentSizes 64
/* A heap holding kTightPct percent of what it may hold at the first drop, or at a large
 * request after it, turns tight: large physical allocations of at most kTightPiece from then
 * on (README, "At the device's limit"). */
#define kTightPct KNOB_I(kTightPct, 90)
#define kTightPiece KNOB_Z(kTightPiece, (size_t)20 << 20)
/* Requests of kStitchMin or more may be stitched when holes give at least 1/kStitchHoleShare
 * of them in whole allocations, or with the best head and tail at least half (before the
 * first drop, or tight) or 1/kStitchEdgeShare less a page (after it) - but while live bytes
 * are at their peak so far before the first drop (a first pass climbing), kClimbPct percent:
 * the free memory a climb leaves beside its live blocks is what its next requests take, so a
 * range there saves nothing at the peak and costs its pieces' access calls (docs/policy-
 * stash.md, "Thirtieth session"); smaller ones from kStitchCoverMin too between the first
 * drop and a repeating turn, and otherwise only when whole free allocations cover them (no
 * new memory) - as any large request under kStitchCoverMin may be (docs/policy-stash.md,
 * "Thirty-first session").
 * A range for a request under kStitchEdgeMin has a head or a tail in a hole only of
 * kStitchSmallEdge or more, and none while a free cached range would hold the request (under
 * pressure, any).
 * New memory for a stitched range: one allocation of at most kStitchPiece, or of
 * 1/kStitchPieces of a request above 64 GiB. Holes smaller than kStitchMinRun hold no whole
 * allocation, and a head or tail gives at least that. */
#define kStitchMin KNOB_Z(kStitchMin, (size_t)128 << 20)
#define kClimbPct KNOB_Z(kClimbPct, (size_t)75)
#define kStitchHoleShare KNOB_I(kStitchHoleShare, 10)
#define kStitchEdgeShare KNOB_I(kStitchEdgeShare, 20)
#define kStitchCoverMin KNOB_Z(kStitchCoverMin, (size_t)48 << 20)
#define kStitchEdgeMin KNOB_Z(kStitchEdgeMin, (size_t)64 << 20)
#define kStitchSmallEdge KNOB_Z(kStitchSmallEdge, (size_t)8 << 20)
#define kStitchPiece KNOB_Z(kStitchPiece, (size_t)1 << 30)
#define kStitchPieces KNOB_I(kStitchPieces, 64)
#define kStitchMinRun KNOB_Z(kStitchMinRun, (size_t)2 << 20)
/* Turn replay's fallback: at most kForecastMax allocations foreseen, and kClearFitTries
 * fitting free blocks tried. */
#define kForecastMax 512
#define kClearFitTries KNOB_I(kClearFitTries, 64)

typedef struct sb_block_s sb_block;
typedef struct sb_arena_s sb_arena;
typedef struct sb_stitch_s sb_stitch;

/* K_DEAD: mapped memory the driver refused access to (set_access failed and the mapping
 * could not be undone): held, never handed out, retried by empty_cache.
 * K_CACHED: a freed block of the small arena kept out of the free sets for the next request
 * of exactly its size (the fast path: no search, no split, no merge), up to 1 MiB in all;
 * merged into the arena ("flushed") before the small arena would grow and by empty_cache. It
 * keeps its stream's tag and epoch: it serves that stream, and any once the epoch is over. */
/* K_VOID: a physical allocation of the arena that empty_cache gave back while blocks lived
 * on both sides of it: its addresses stay the arena's, with no memory behind them, out of the
 * free sets until the arena needs memory again (arena_take_back). */
enum { K_FREE = 0, K_USER = 1, K_PHANTOM = 2, K_DEAD = 3, K_CACHED = 4, K_VOID = 5 };
#define kCacheSizes (kSmallLimit / kMinBlock) /* the small arena's 2048 block sizes */
/* cached at most; more would hide free memory from best fit and grow the small arena */
#define kCacheMaxBytes KNOB_Z(kCacheMaxBytes, (size_t)1 << 20)

struct sb_block_s {
  bs_node_t snode;    /* free: in arena->by_size[tag], by (size, address) */
  bs_node_t anode;    /* free: in arena->by_addr */
  uint64_t ptr;
  size_t size;
  size_t requested;   /* user: bytes asked for */
  void* stream;       /* user: allocation stream */
  sb_arena* arena;    /* NULL for a stitched user block */
  sb_stitch* stitch;  /* stitched user block, or phantom: the range it serves */
  sb_block* prev;     /* arena blocks: address neighbours */
  sb_block* next;
  sb_block* tprev;    /* free, tagged: the stream's list of its tagged blocks */
  sb_block* tnext;
  void** uses;        /* user: other streams it was used on */
  uint32_t nuses, cap_uses;
  int event_count;    /* user, freed: events still to complete */
  uint64_t loop_id;   /* large user block: its event in the loop detector */
  uint64_t fate_key;  /* large user block recorded by fate.c (fated): its key and step */
  uint32_t tag;       /* free: 0 = any stream may use it; k = stream slot k only, for now */
  uint32_t fate_step;
  uint64_t epoch;     /* free, tagged: the stream's epoch when it was freed */
  uint8_t kind;
  bool allocated;     /* user: live (false: freed, waiting for events) */
  bool fated;
};

/* A physical allocation of an arena, at pages [first_page, first_page + npages) of it. New
 * memory made for a stitched range is mapped there only when the arena first hands out a
 * block on it (H_UNMAPPED until then): a range that its pages keep serving, turn after turn,
 * never pays for the second mapping. */
enum { H_READY = 0, H_UNMAPPED = 1, H_NOACCESS = 2 /* mapped, cuMemSetAccess failed */,
       H_RELEASED = 3 /* given back by empty_cache: no memory (a K_VOID block) */ };
typedef struct sb_handle_s {
  size_t first_page;
  size_t npages;
  uint64_t handle;
  uint8_t access;
} sb_handle;

struct sb_arena_s {
  bool small;
  bool reserved;      /* the virtual range exists */
  uint64_t base;
  size_t va_size;
  size_t mapped;      /* bytes mapped from base */
  sb_handle* handles; /* in address order, tiling [base, base + mapped) */
  size_t nhandles, cap_handles;
  blockset_t by_addr; /* free blocks by address */
  blockset_t* by_size;/* [tag]: free blocks of that tag by (size, address) */
  sb_block* first;
  sb_block* last;
  size_t grow_bytes;
  size_t nlazy;       /* physical allocations not yet usable at their arena address */
  size_t lazy_from;   /* no page below it is in one of those (a bound, not always the least):
                         most blocks lie below all of them, and arena_ready skips its search */
  size_t released;    /* bytes of H_RELEASED allocations: in mapped, not reserved */
  size_t nreleased;   /* ... and how many */
  uint32_t* ranged;   /* [page]: how many stitched ranges map that page of the arena */
  size_t cap_ranged;
  size_t nranged;     /* pages of the arena some range maps */
  size_t free_bytes;  /* bytes in free blocks (the free sets) */
  size_t free_at_grow;/* free_bytes when the last growth (not for a range) was asked for */
  size_t last_grow_pages;      /* the last growth (not for a stitched range) ... */
  uint64_t allocs_at_last_grow; /* ... and sb_state.nallocs then */
  sb_block key;       /* the search key of fits_begin, kept here so that a search does not
                         clear a whole block on the stack first (that cost ~30% of try_alloc) */
};

struct sb_stitch_s {
  sb_stitch* prev_st;
  sb_stitch* next_st;
  uint64_t va;
  size_t npages;
  size_t page;        /* the page size (the heap's granularity) */
  uint32_t* homes;    /* the range's pages, in order: arena page indices (kSmallHome marks a
                         page of the small arena, else of the large) */
  bool small_homes;   /* some of them are the small arena's */
  size_t offset;      /* where its block starts in the range (past the used part of a
                         partly free first allocation) */
  size_t lent_end;    /* the range's bytes [offset, lent_end) are lent (its block's room) */
  sb_block* user;     /* the live (or pending) block using it, or NULL */
  sb_block* phantoms; /* while lent: the phantom blocks holding its arena memory, linked by
                         tnext (stitch_return finds them there, not by walking the arenas) */
  uint32_t id;        /* its number (turn replay's place for the block it served) */
};

typedef struct sb_stream_s {
  void* stream;
  uint64_t epoch_next; /* the epoch given to blocks freed now */
  uint64_t epoch_done; /* its latest epoch known to be over (cached blocks: usable by all) */
  bool dirty;          /* blocks freed since the last event on this stream */
  uint32_t allocs;     /* its allocations since it last closed its own epoch */
  uint32_t frees;      /* its frees since its epoch last closed */
  uint64_t last_alloc; /* sb_state.nallocs at its last allocation */
  uint64_t nallocs;    /* its allocations so far */
  sb_block* thead;     /* free blocks tagged with this slot */
} sb_stream;

typedef struct sb_state_s {
  sb_arena arenas[2];  /* [0] small, [1] large */
  sb_stream* streams;  /* slots 1..nstreams (0 unused) */
  size_t nstreams, cap_streams;
  uint32_t lead;       /* the slot that has made the most allocations (an eighth more than
                        * the last lead's when it changed; 0: none yet) */
  size_t pending_uses; /* blocks freed with record_stream's uses, their events outstanding */
  size_t lead_lag;     /* the lead's queued events found incomplete when last polled */
  sb_stitch* stitches;
  uint32_t stitch_ids; /* ranges numbered so far */
  uint64_t stitch_va, stitch_va_end;  /* bump allocation of stitched ranges */
  uint64_t* va_ranges; /* every reservation, for destroy: pairs (va, size) */
  size_t nva_ranges, cap_va_ranges;
  stash_zombies_t zombies; /* memory the driver refused to take back, retried later */
  slab_t block_slab;
  ptrmap_t allocated;  /* address -> user block (live) */
  stash_events_t events;
  uint64_t nallocs;    /* allocation requests so far */
  uint64_t allocs_at_free; /* nallocs at the last free: none freed since, a run that long */
  sb_block* cache[kCacheSizes]; /* [size / 512 - 1]: K_CACHED blocks, linked by tnext */
  size_t ncached;
  size_t cached_bytes;
  stash_loop_t loop;   /* the large blocks' loop detector (loop.c), for turn replay */
  stash_fate_t fate;   /* what the previous step's blocks did (fate.c), for placement */
  uint64_t forecast[kForecastMax][2]; /* _stash_loop_forecast's answer: (offset, size) */
  int64_t live_peak;   /* the most bytes allocated at once since nothing was (the stats' peak
                          resets do not touch it) */
  bool dropped;        /* live bytes have fallen to half of live_peak since: no more bursts */
  bool tight;          /* the device was nearly full at or after the first drop: small pieces */
  bool freed;          /* a block has been freed since nothing was live (else: loading) */
  size_t largest;      /* the largest request since nothing was live */
  bool grown_to_peak;  /* the large arena grew at once to a step's predicted peak (fate.c)
                          since nothing was live: a range's new memory is mapped at once */
  size_t recent[kRecentSizes]; /* the sizes of the last large requests, a ring */
  uint64_t nrecent;    /* large requests so far (the ring's next slot, modulo) */
} sb_state;

static inline sb_state* S(stash_heap_t* h) { return (sb_state*)h->policy_state; }

/* A stitched range's page: its arena and its index there. */
#define kSmallHome ((uint32_t)1 << 31)
static inline sb_arena* home_arena(sb_state* s, uint32_t v) {
  return &s->arenas[v & kSmallHome ? 0 : 1];
}
static inline size_t home_page(uint32_t v) { return v & ~kSmallHome; }
#define G (h->granularity)
#define FROM_SNODE(n) ((sb_block*)((char*)(n) - offsetof(sb_block, snode)))
#define FROM_ANODE(n) ((sb_block*)((char*)(n) - offsetof(sb_block, anode)))
#define PCALL _STASH_PCALL
#define prov_fail _stash_prov_fail

/* The arena bytes st lends, [offset, lent_end) of the range through its pages: call the
 * body with each run [run_at, run_at + run_len) of consecutive bytes of arena run_arena. */
#define FOR_LENT(s, st, ...)                                                              \
  for (size_t lo_ = (st)->offset; lo_ < (st)->lent_end;) {                               \
    size_t i_ = lo_ / G, j_ = i_ + 1;                                                    \
    while (j_ * G < (st)->lent_end && (st)->homes[j_] == (st)->homes[j_ - 1] + 1) j_++;  \
    size_t hi_ = j_ * G < (st)->lent_end ? j_ * G : (st)->lent_end;                      \
    sb_arena* run_arena = home_arena((s), (st)->homes[i_]);                              \
    uint64_t run_at = run_arena->base + (uint64_t)home_page((st)->homes[i_]) * G +       \
                      (lo_ - i_ * G);                                                    \
    size_t run_len = hi_ - lo_;                                                          \
    __VA_ARGS__;                                                                         \
    lo_ = hi_;                                                                           \
  }

/* ---- Statistics -------------------------------------------------------------------------------- */

static inline void stat_inc(stash_stat_t* a, bool small, size_t n) {
  _stash_stat_array_inc(a, small, (int64_t)n);
}
static inline void stat_dec(stash_stat_t* a, bool small, size_t n) {
  _stash_stat_array_dec(a, small, (int64_t)n);
}

/* A block of the small pool (statistics, the loop detector): by its size, as in PyTorch - a
 * small block may lie in the large arena (try_alloc, in a repeating turn). */
static inline bool block_small(const sb_block* b) { return b->size <= kSmallLimit; }

/* ---- Small helpers, for the hot path and the cold files alike --------------------------- */

static inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* The largest physical allocation new memory for `size` bytes comes in: `least`, or a
 * 1/parts share of a huge request (which would otherwise cost hundreds of pieces). */
static inline size_t piece_bytes(size_t size, size_t least, size_t parts, size_t granularity) {
  size_t share = round_up(size / parts, granularity);
  return share > least ? share : least;
}

/* max_piece_size_mb, or kTightPiece once the heap is tight: the largest physical allocation
 * the large arena makes, in bytes (a multiple of the granularity), or 0 when the policy
 * chooses (the default). */
static inline size_t piece_limit(const stash_heap_t* h) {
  size_t m = h->conf.max_piece_size;
  if (!m && ((const sb_state*)h->policy_state)->tight) m = kTightPiece;
  return m && m <= SIZE_MAX / 2 ? round_up(m, G) : 0;
}

/* The usable free bytes at the arena's end for a request of stream slot `slot`. */
static inline size_t free_tail(const sb_arena* a, uint32_t slot) {
  const sb_block* t = a->last;
  if (t && t->kind == K_FREE && (t->tag == 0 || t->tag == slot)) return t->size;
  return 0;
}

/* Whether a stitched range maps any of pages [first, first + n) of arena a. */
static inline bool ranged_pages(const sb_arena* a, size_t first, size_t n) {
  if (!a->nranged) return false;
  for (size_t p = first; p < first + n && p < a->cap_ranged; p++)
    if (a->ranged[p]) return true;
  return false;
}

/* Whether [ptr, ptr + size) of arena a touches a page some stitched range maps. */
static inline bool ranged_at(stash_heap_t* h, const sb_arena* a, uint64_t ptr, size_t size) {
  size_t lo = (size_t)(ptr - a->base) / G, hi = (size_t)(ptr + size - 1 - a->base) / G;
  return ranged_pages(a, lo, hi - lo + 1);
}

/* Whether cached range st may serve a block of `size` bytes: no block uses it, and its room
 * holds the block and is at most twice it and a page (a larger range is left for a larger
 * block). */
static inline bool range_holds(const stash_heap_t* h, const sb_stitch* st, size_t size) {
  size_t room = st->lent_end - st->offset;
  return !st->user && room >= size && room <= 2 * size + G;
}

/* Make ub range st's block: at the start of its room. */
static inline void range_user(sb_stitch* st, sb_block* ub, size_t size) {
  ub->ptr = st->va + st->offset;
  ub->size = size;
  ub->stitch = st;
  st->user = ub;
}

/* ---- policy_stash_arena.c: the arenas' memory ---------------------------------------------- */

/* Reserve a virtual address range (freed by destroy). */
STASH_HIDDEN stash_status_t _stash_sb_va_reserve(stash_heap_t* h, size_t size, uint64_t* out);
/* Map new memory at the arena's end (its growth rules: policy_stash.c's header). */
STASH_HIDDEN stash_status_t _stash_sb_arena_grow(stash_heap_t* h, sb_arena* a, size_t need_pages,
                                                 uint32_t slot, bool exact, size_t cap_bytes,
                                                 bool lazy);
/* empty_cache: give back the arena's free end, then what lies wholly free between live blocks
 * (but in a free block of keep_from bytes or more); try dead memory again. */
STASH_HIDDEN stash_status_t _stash_sb_arena_shrink(stash_heap_t* h, sb_arena* a);
STASH_HIDDEN stash_status_t _stash_sb_arena_give_back(stash_heap_t* h, sb_arena* a,
                                                      size_t keep_from);
STASH_HIDDEN stash_status_t _stash_sb_arena_revive(stash_heap_t* h, sb_arena* a);
/* Memory again behind what empty_cache gave back: where it makes room for a request of
 * `size`, or under [at, at + size) for turn replay. */
STASH_HIDDEN stash_status_t _stash_sb_arena_take_back(stash_heap_t* h, sb_arena* a, size_t size,
                                                      uint32_t slot);
STASH_HIDDEN stash_status_t _stash_sb_take_back_range(stash_heap_t* h, sb_arena* a, uint64_t at,
                                                      size_t size, uint32_t slot);
/* The index of the first physical allocation of arena a that ends after page p. */
STASH_HIDDEN size_t _stash_sb_handle_after(const sb_arena* a, size_t p);
/* Map and make accessible the allocations under [ptr, ptr + size) not yet usable at their
 * arena address (arena_ready's work, called by it only once its test below finds one). */
STASH_HIDDEN stash_status_t _stash_sb_arena_ready(stash_heap_t* h, sb_arena* a, uint64_t ptr,
                                                  size_t size);

/* Whether [ptr, ptr + size) of the large arena lies on an allocation not yet usable at its
 * arena address (handing a block out there maps it: arena_ready's driver calls). */
STASH_HIDDEN bool _stash_sb_arena_unready(const stash_heap_t* h, const sb_arena* a,
                                          uint64_t ptr, size_t size);

/* Make [ptr, ptr + size) of the large arena usable before a block there is handed out. The
 * first test is inline, for the allocation path: nearly every call ends there, no allocation
 * under the block waiting to be mapped at its arena address; the rest is
 * _stash_sb_arena_ready's (policy_stash_arena.c). */
static inline stash_status_t arena_ready(stash_heap_t* h, sb_arena* a, uint64_t ptr,
                                         size_t size) {
  if (!a->nlazy || (size_t)(ptr + size - a->base + G - 1) / G <= a->lazy_from) return STASH_OK;
  return _stash_sb_arena_ready(h, a, ptr, size);
}

/* ---- policy_stash_stitch.c: stitched ranges ------------------------------------------------ */

/* A stitched range for a block of `size` bytes: a cached one, or a new one if the holes give
 * enough of it; *out = NULL: grow the arena instead. */
STASH_HIDDEN stash_status_t _stash_sb_stitch_alloc(stash_heap_t* h, size_t size, uint32_t slot,
                                                   bool cover_only, bool pressed,
                                                   sb_stitch** out);
/* Whether all the memory st lends is free for stream slot `slot` now; lend it (as phantom
 * blocks); take it back, tagged, when its block is freed. */
STASH_HIDDEN bool _stash_sb_stitch_available(stash_heap_t* h, const sb_stitch* st,
                                             uint32_t slot);
STASH_HIDDEN stash_status_t _stash_sb_stitch_lend(stash_heap_t* h, sb_stitch* st);
STASH_HIDDEN void _stash_sb_stitch_return(stash_heap_t* h, sb_stitch* st, uint32_t tag,
                                          uint64_t epoch);
/* Unmap a free stitched range and forget it. */
STASH_HIDDEN stash_status_t _stash_sb_stitch_release(stash_heap_t* h, sb_stitch* st);

/* ---- policy_stash_check.c: introspection --------------------------------------------------- */

STASH_HIDDEN stash_status_t _stash_sb_visit(stash_heap_t* h, stash_visit_fn fn, void* arg);
STASH_HIDDEN stash_status_t _stash_sb_check(stash_heap_t* h);

#endif
