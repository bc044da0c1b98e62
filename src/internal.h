/* stash internals: the module map. Each section lists what one file offers; calls go one
 * way: heap.c -> policy_*.c -> {events.c, provider.c} -> the provider table, with
 * stats.c, error.c, blockset.c, ptrmap.c, slab.c, loop.c and fate.c as leaves.
 *
 * Internal symbols start with _stash_ and are hidden from the shared library.
 */
#ifndef STASH_INTERNAL_H
#define STASH_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stash.h"
#include "stash_provider.h"

#if defined(__GNUC__)
#define STASH_HIDDEN __attribute__((visibility("hidden")))
#define STASH_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define STASH_LIKELY(x) __builtin_expect(!!(x), 1)
#define STASH_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define STASH_HIDDEN
#define STASH_PRINTF(f, a)
#define STASH_LIKELY(x) (x)
#define STASH_UNLIKELY(x) (x)
#endif

#define STASH_KiB ((size_t)1 << 10)
#define STASH_MiB ((size_t)1 << 20)
#define STASH_GiB ((size_t)1 << 30)

/* ---- error.c ---------------------------------------------------------------------------- */

/* Record a failure for stash_last_error() and the error handler; returns status. */
STASH_HIDDEN stash_status_t _stash_error(stash_status_t status, const char* fmt, ...)
    STASH_PRINTF(2, 3);
STASH_HIDDEN stash_status_t _stash_verror(stash_status_t status, const char* fmt, va_list ap);
/* The message the last provider call left (stash_provider_error), or "" - and clear it. */
STASH_HIDDEN const char* _stash_provider_message(void);
STASH_HIDDEN void _stash_provider_message_clear(void);
/* PyTorch's format_size: "512 bytes", "1.50 KiB", "20.00 MiB", "1.23 GiB". */
STASH_HIDDEN void _stash_format_size(size_t bytes, char* buf, size_t n);
/* Append formatted text to buf[0..n) at *len, and add to *len what it needs whether or not it
 * fits (snprintf's contract, for a text built in pieces: a caller sizes its buffer from it). */
STASH_HIDDEN void _stash_appendf(char* buf, size_t n, size_t* len, const char* fmt, ...)
    STASH_PRINTF(4, 5);

/* ---- blockset.c: an intrusive ordered set (red-black tree) ------------------------------- */

typedef struct bs_node_s {
  struct bs_node_s* left;
  struct bs_node_s* right;
  struct bs_node_s* parent;
  int red;
} bs_node_t;

/* Strict weak order: negative if a < b, 0 if equal, positive if a > b. */
typedef int (*bs_cmp_fn)(const bs_node_t* a, const bs_node_t* b);

typedef struct blockset_s {
  bs_node_t* root; /* NULL when empty */
  bs_cmp_fn cmp;
  size_t count;
  int nkeys;         /* 0: cmp orders; else the order is that of nkeys 64-bit unsigned ... */
  ptrdiff_t key[3];  /* ... fields at these byte offsets from a node, compared in turn */
} blockset_t;

STASH_HIDDEN void _stash_bs_init(blockset_t* s, bs_cmp_fn cmp);
/* A set ordered by up to three 64-bit unsigned fields of the object around each node, at
 * byte offsets from it (offsetof(field) - offsetof(node)), compared in turn - the order cmp
 * also gives (kept for a set's checks), without a call per comparison. */
STASH_HIDDEN void _stash_bs_init_keys(blockset_t* s, bs_cmp_fn cmp, int nkeys, ptrdiff_t k0,
                                      ptrdiff_t k1, ptrdiff_t k2);
/* Insert n (not in any set). Returns false, inserting nothing, if an equal node exists. */
STASH_HIDDEN bool _stash_bs_insert(blockset_t* s, bs_node_t* n);
STASH_HIDDEN void _stash_bs_erase(blockset_t* s, bs_node_t* n);
/* Put n (not in any set) in old's place, old leaving the set: O(1), no comparison. The caller
 * guarantees that n orders where old did - between old's neighbours. */
STASH_HIDDEN void _stash_bs_replace(blockset_t* s, bs_node_t* old, bs_node_t* n);
/* The first node not less than key, or NULL. */
STASH_HIDDEN bs_node_t* _stash_bs_lower_bound(const blockset_t* s, const bs_node_t* key);
STASH_HIDDEN bs_node_t* _stash_bs_first(const blockset_t* s);
STASH_HIDDEN bs_node_t* _stash_bs_last(const blockset_t* s);
STASH_HIDDEN bs_node_t* _stash_bs_next(const bs_node_t* n);
STASH_HIDDEN bs_node_t* _stash_bs_prev(const bs_node_t* n);
/* Verify the red-black and ordering invariants; returns false on the first violation. */
STASH_HIDDEN bool _stash_bs_valid(const blockset_t* s);

/* ---- ptrmap.c: device address -> object (open addressing) -------------------------------- */

typedef struct ptrmap_slot_s {
  uint64_t key; /* 0 = empty */
  void* value;
} ptrmap_slot_t;

typedef struct ptrmap_s {
  ptrmap_slot_t* slots;
  size_t cap;     /* power of two */
  size_t count;
  unsigned shift; /* 64 - log2(cap): a key's home slot is the top bits of its product */
} ptrmap_t;

STASH_HIDDEN void _stash_ptrmap_init(ptrmap_t* m);
STASH_HIDDEN void _stash_ptrmap_free(ptrmap_t* m);
/* key != 0. STASH_ERR_HOST_OOM if growing fails (nothing inserted). Replaces an existing
 * value. */
STASH_HIDDEN stash_status_t _stash_ptrmap_put(ptrmap_t* m, uint64_t key, void* value);
STASH_HIDDEN void* _stash_ptrmap_get(const ptrmap_t* m, uint64_t key);
/* Remove key; returns its value or NULL. */
STASH_HIDDEN void* _stash_ptrmap_take(ptrmap_t* m, uint64_t key);
/* Make room for `extra` more keys now, so that the next puts cannot fail. */
STASH_HIDDEN stash_status_t _stash_ptrmap_reserve(ptrmap_t* m, size_t extra);
/* The same, inline where the table has that room already (no call: an allocation's path). */
static inline stash_status_t _stash_ptrmap_room(ptrmap_t* m, size_t extra) {
  return (m->count + extra) * 2 <= m->cap ? STASH_OK : _stash_ptrmap_reserve(m, extra);
}

/* ---- slab.c: fixed-size objects carved from large chunks --------------------------------- */

typedef struct slab_s {
  size_t obj_size;
  size_t per_chunk;
  void* free_list;
  void* chunks; /* singly linked through each chunk's first word */
  size_t live;
} slab_t;

STASH_HIDDEN void _stash_slab_init(slab_t* s, size_t obj_size);
/* A zeroed object, or NULL when the host is out of memory. */
STASH_HIDDEN void* _stash_slab_alloc(slab_t* s);
/* The same, not zeroed: for an object the caller overwrites whole. */
STASH_HIDDEN void* _stash_slab_take(slab_t* s);
STASH_HIDDEN void _stash_slab_free(slab_t* s, void* obj);
STASH_HIDDEN void _stash_slab_destroy(slab_t* s);
/* Room for `need` elements of `size` bytes in array v of *cap: v itself when it has it, else v
 * reallocated to the first doubling of *cap (or of `least`) that holds them, *cap updated;
 * NULL when the host is out of memory (v and *cap untouched). */
STASH_HIDDEN void* _stash_array_grow(void* v, size_t* cap, size_t need, size_t size, size_t least);
/* splitmix64's step: x plus the golden ratio, finalized - a well-mixed hash of x (loop.c's
 * codes, fate.c's keys) and, applied to a counter, a sequence of random numbers (the
 * simulator's fault injection). */
static inline uint64_t _stash_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* ---- default_heap.c, for plugins.c ------------------------------------------------------- */

/* A new heap configured as `device`'s default heap is (its STASH_CONF and provider), but not
 * one of the default heaps: a CUDA graph's private pool. Destroy it with stash_heap_destroy
 * before stash_default_shutdown. */
STASH_HIDDEN stash_status_t _stash_default_heap_sibling(int device, stash_heap_t** out);

/* ---- loop.c: notices a repeating loop of large allocations (turn replay) ---------------- */

#define STASH_LOOP_NONE UINT64_MAX
/* An allocation's place with this bit set is not an arena offset but the number of the
 * place it went to outside the arena (policy:stash: a stitched range), in the low 32 bits. */
#define STASH_LOOP_ELSEWHERE ((uint64_t)1 << 63)

typedef struct stash_loop_ev_s { /* one allocation or free */
  uint64_t code;   /* an allocation of some size, or the free of one made some events before */
  uint64_t offset; /* where an allocation went: an arena offset, STASH_LOOP_ELSEWHERE | n, or
                      STASH_LOOP_NONE */
  int64_t live;    /* bytes allocated less bytes freed, after this event */
  uint64_t freed;  /* an allocation: the event that freed it (0 while it lives) */
  uint64_t same;   /* an allocation: the one of its size before it, + 1 (0: none known) */
} stash_loop_ev_t;

typedef struct stash_loop_s {
  stash_loop_ev_t* ev; /* events [base, base + n) */
  size_t n, cap;
  uint64_t base;
  uint64_t* table;     /* hash of the last codes -> the event ending them, + 1 */
  uint64_t* last_of;   /* hash of an allocation's code -> the latest allocation with it, + 1 */
  uint64_t hash;       /* the rolling hash of the last codes ... */
  uint64_t base_pow;   /* ... and its multiplier to the power of their number */
  uint64_t period;     /* the proposed length of a turn in events, 0 for none */
  int64_t live;        /* bytes allocated less bytes freed, after the last event */
  bool disabled;       /* out of host memory once: detects nothing any more */
} stash_loop_t;

STASH_HIDDEN void _stash_loop_init(stash_loop_t* L);
STASH_HIDDEN void _stash_loop_free(stash_loop_t* L);
/* Record an allocation of size bytes placed at offset in the arena (STASH_LOOP_ELSEWHERE |
 * n: in place n outside it; STASH_LOOP_NONE: unknown); returns its event number, for
 * _stash_loop_freed. */
STASH_HIDDEN uint64_t _stash_loop_alloc(stash_loop_t* L, size_t size, uint64_t offset);
/* Record the free of allocation `id` (STASH_LOOP_NONE if it has none) of size bytes. */
STASH_HIDDEN void _stash_loop_freed(stash_loop_t* L, uint64_t id, size_t size);
/* Whether the allocation of size bytes about to happen is the counterpart of one a turn
 * earlier (when that one still lives: the allocation of its size it lived beside, two turns
 * earlier where the turns align), within a loop whose period holds, and the place that one
 * got (an arena offset, or STASH_LOOP_ELSEWHERE | n). */
STASH_HIDDEN bool _stash_loop_hint(const stash_loop_t* L, size_t size, uint64_t* offset);
/* Where the allocations that the one about to happen will live beside are likely to go:
 * when it has a counterpart (as for _stash_loop_hint, whatever the offset that one got), the
 * [offset, offset + size) of each allocation placed in the arena after the counterpart and
 * before it was freed (at most one turn), written as pairs to out[0 .. *n), at most max of
 * them. False when there is no counterpart. */
STASH_HIDDEN bool _stash_loop_forecast(const stash_loop_t* L, size_t size, uint64_t (*out)[2],
                                       size_t max, size_t* n);

/* The rolling hash of the last large events (kWindow of them), the context that names an
 * allocation about to happen in fate.c; STASH_LOOP_NONE once the detector is off. */
STASH_HIDDEN uint64_t _stash_loop_context(const stash_loop_t* L);

/* ---- fate.c: what the previous training step's counterpart of an allocation did --------- */

typedef enum {
  STASH_FATE_UNKNOWN = 0,     /* no counterpart, or one made after the step's first huge request
                                 or freed before it, or a step without a huge request */
  STASH_FATE_AROUND_HUGE = 1, /* freed between the step's first and last huge requests */
  STASH_FATE_STAYS = 2        /* lived past the step's last huge request */
} stash_fate_class_t;

typedef struct stash_fate_slot_s {
  uint64_t key;   /* size and context */
  uint64_t born;  /* the clock when the key's latest allocation was made (0: an empty slot) */
  uint64_t freed; /* ... and when a block of the key was first freed after that (0: none) */
  uint64_t gen;   /* the table's generation it was written in (an older one: empty) */
} stash_fate_slot_t;

typedef struct stash_fate_step_s {
  stash_fate_slot_t* slots; /* open addressing by key, at most half full */
  size_t cap, nkeys;
  uint64_t gen;             /* slots written in another generation are empty: a new step's
                               table is the old one with its generation moved on, not cleared */
  uint64_t first_huge, last_huge; /* the clock at the step's first and last huge request */
} stash_fate_step_t;

typedef struct stash_fate_s {
  stash_fate_step_t step[2]; /* [nsteps & 1]: this step; the other: the previous one */
  uint64_t nsteps;           /* steps ended so far */
  uint64_t clock;            /* large allocations asked for and large blocks freed so far */
  int64_t peak;              /* the most bytes live in this step */
  bool between;              /* between two steps (live bytes fell under a quarter of peak) */
  bool disabled;             /* out of host memory once: no more predictions */
  bool asked;                /* a request predicted and not yet recorded: ... */
  bool asked_huge;           /* ... a huge one? ... */
  uint64_t asked_key;        /* ... its key */
  size_t asked_size;         /* ... its size */
  int64_t asked_live;        /* ... and live bytes then */
  /* A step with no huge request may have requests huge for it (kRelHuge or more and at least
   * half its largest, made while live bytes were high: a smaller model's logits), known when
   * it ends; such a step also ends when live bytes fall under half the way from its floor to
   * its peak. */
  int64_t floor;             /* the fewest bytes live since the last step ended */
  int64_t prev_peak, prev_floor; /* the previous step's peak and floor */
  size_t largest;            /* the largest request of this step */
  uint64_t step_start;       /* the clock when this step's records began */
  uint64_t rel_clock[64];    /* requests that may be huge for this step: when made, ... */
  size_t rel_size[64];       /* ... and their sizes */
  int nrel;
  bool had_huge, prev_had_huge; /* a request of kHuge or more in this step / the previous */
  bool grow_armed;           /* the second step's growth not yet asked for */
  int64_t grow_to;           /* live bytes the second step is predicted to reach (once) */
  /* Requests of kRelSmall to kRelHuge count as huge for a step only in a run whose live bytes
   * have never fallen to half their peak (fate.c). */
  int64_t peak_ever;         /* the most bytes live so far */
  bool halved;               /* live bytes have fallen under half of peak_ever */
  bool prev_small;           /* the previous step's huge requests were all under kRelHuge */
  bool loaded;               /* a recorded block has been freed: the weights are loaded */
  int64_t loaded_live;       /* live bytes at the last large request before that free */
} stash_fate_t;

STASH_HIDDEN void _stash_fate_init(stash_fate_t* F);
STASH_HIDDEN void _stash_fate_free(stash_fate_t* F);
/* Before a large allocation of size bytes, with `live` bytes allocated (both pools) and
 * `context` the loop detector's: what its counterpart in the previous step did. Call once per
 * request, made or not. */
STASH_HIDDEN stash_fate_class_t _stash_fate_predict(stash_fate_t* F, uint64_t context,
                                                    size_t size, int64_t live);
/* Before a small allocation: live bytes, to follow the steps. */
STASH_HIDDEN void _stash_fate_live(stash_fate_t* F, int64_t live);
/* Record the allocation just predicted (the last _stash_fate_predict, if no other call came
 * between), made: false if not recorded (one made after its step's first huge request is
 * not), else its key and step for _stash_fate_freed. */
STASH_HIDDEN bool _stash_fate_alloc(stash_fate_t* F, uint64_t* key, uint32_t* step);
/* Record the free of a block that _stash_fate_alloc recorded. */
STASH_HIDDEN void _stash_fate_freed(stash_fate_t* F, uint64_t key, uint32_t step);
/* Once, at the second step's first request whose counterpart was freed around the first
 * step's huge requests, if those were huge only relative to that step (under kHuge): the live
 * bytes the second step is predicted to reach - its floor so far plus what the first step
 * held above its own - for the policy to grow to at once; 0 otherwise. */
STASH_HIDDEN int64_t _stash_fate_take_growth(stash_fate_t* F);
/* Whether a step has ended (a run's first forward pass is over). */
STASH_HIDDEN bool _stash_fate_stepped(const stash_fate_t* F);

/* ---- stats.c ------------------------------------------------------------------------------ */

/* PyTorch's Stat.increase(n): current += n, peak = max(peak, current), allocated += n; and
 * Stat.decrease(n): current -= n, freed += n. Inline: every allocation and free updates
 * several. */
static inline void _stash_stat_inc(stash_stat_t* s, int64_t n) {
  s->current += n;
  if (s->current > s->peak) s->peak = s->current;
  s->allocated += n;
}
static inline void _stash_stat_dec(stash_stat_t* s, int64_t n) {
  s->current -= n;
  s->freed += n;
}
/* Update "all" and the pool's entry of a stat array. */
static inline void _stash_stat_array_inc(stash_stat_t* a, bool small, int64_t n) {
  _stash_stat_inc(&a[STASH_STAT_ALL], n);
  _stash_stat_inc(&a[small ? STASH_STAT_SMALL : STASH_STAT_LARGE], n);
}
static inline void _stash_stat_array_dec(stash_stat_t* a, bool small, int64_t n) {
  _stash_stat_dec(&a[STASH_STAT_ALL], n);
  _stash_stat_dec(&a[small ? STASH_STAT_SMALL : STASH_STAT_LARGE], n);
}
/* The array statistics as a heap check counts them from the blocks. */
typedef struct stash_stat_counts_s {
#define STASH_X_(name, doc) int64_t name[STASH_STAT_NTYPES];
  STASH_STAT_ARRAYS(STASH_X_)
#undef STASH_X_
} stash_stat_counts_t;
/* A heap check's comparison of the array statistics with the counts (their [SMALL] and
 * [LARGE]): each pool's current equals its count, "all" is their sum, and no peak is below
 * its current. STASH_OK, or STASH_ERR_INVALID naming the statistic. */
STASH_HIDDEN stash_status_t _stash_stats_check(const stash_stats_t* st, const stash_stat_counts_t* n);
STASH_HIDDEN void _stash_stats_reset_peak(stash_stats_t* s);
STASH_HIDDEN void _stash_stats_reset_accumulated(stash_stats_t* s);

/* ---- provider.c: checked calls through a heap's provider table --------------------------- */

/* Validate and copy a provider table. */
STASH_HIDDEN stash_status_t _stash_provider_copy(stash_provider_t* dst,
                                                 const stash_provider_t* src);
/* Whether the table has the virtual-memory group. */
STASH_HIDDEN bool _stash_provider_has_vmm(const stash_provider_t* p);

/* ---- provider_cuda.c (tests and tools only) ------------------------------------------------ */

/* A driver entry point the CUDA provider resolved ("cuMemsetD32Async", ...), or NULL. */
STASH_HIDDEN void* _stash_cuda_symbol(const char* name);
/* Make the device's primary context current on this thread; 0 on success. */
STASH_HIDDEN int _stash_cuda_context_current(int device);

/* ---- provider.c: calls through a heap's provider ---------------------------------------- */

/* Call a provider function of heap h, clearing the thread's provider message first. */
#define _STASH_PCALL(h, fn, ...) \
  (_stash_provider_message_clear(), (h)->prov.fn((h)->prov.ctx, __VA_ARGS__))
/* Report a failed provider call: "provider 'sim' failed to <what>: <its message>". */
STASH_HIDDEN stash_status_t _stash_prov_fail(stash_heap_t* h, stash_status_t st,
                                             const char* what);

/* ---- events.c: events for blocks used on other streams ------------------------------------ */

typedef struct stash_ev_entry_s {
  uint64_t event;
  void* item;
  bool deferred; /* queued during a capture: its event not recorded yet (event unset) */
} stash_ev_entry_t;

typedef struct stash_ev_queue_s { /* one stream's FIFO */
  void* stream;
  stash_ev_entry_t* v;
  size_t head, n, cap;
} stash_ev_queue_t;

typedef struct stash_ev_poll_s { /* _stash_events_poll_fewer's settings */
  void* skip;         /* a stream whose queue may wait */
  bool has_skip;
  size_t skip_below;  /* ... while it holds fewer entries than this */
} stash_ev_poll_t;

typedef struct stash_events_s {
  stash_ev_queue_t* queues; /* PyTorch's cuda_events, one queue per stream */
  size_t nqueues, cap_queues;
  uint64_t* pool;           /* events ready for reuse */
  size_t npool, cap_pool;
  size_t nevents;           /* events created (pooled or queued) */
  size_t ndeferred;         /* entries queued during captures, their events not recorded yet */
} stash_events_t;

typedef void (*stash_ev_done_fn)(stash_heap_t* h, void* item);

/* Record an event on each of streams[0..n) and queue (event, item) on each stream's FIFO;
 * all or nothing. While a CUDA graph capture is underway (h->capturing), the entries are
 * queued with no event - the driver refuses to query an event recorded in a capture - and
 * the first poll after the last capture ends records them (as PyTorch defers them). */
STASH_HIDDEN stash_status_t _stash_events_record(stash_heap_t* h, stash_events_t* e,
                                                 void* const* streams, size_t n, void* item);
/* Call done(item) for every completed entry, in order per stream, stopping at a stream's
 * first incomplete one; with wait, wait for every entry instead. During a capture: nothing
 * (no event is queried, as PyTorch processes none then). Inline where nothing is queued
 * (deferred entries are queued too): an allocation with no event outstanding - most of
 * them - makes no call. */
STASH_HIDDEN stash_status_t _stash_events_poll_queues(stash_heap_t* h, stash_events_t* e,
                                                      bool wait, stash_ev_done_fn done,
                                                      const stash_ev_poll_t* how);
static inline stash_status_t _stash_events_poll(stash_heap_t* h, stash_events_t* e, bool wait,
                                                stash_ev_done_fn done) {
  return e->nqueues ? _stash_events_poll_queues(h, e, wait, done, NULL) : STASH_OK;
}
/* The same, without waiting, in fewer queries (policy:stash; policy:pytorch queries as PyTorch
 * does, entry by entry): a stream's entries complete in order, so once its first entry has
 * completed its last is asked, and if that has too, all are done with two queries. And the
 * queue of stream `skip`, if has_skip, is left for a later poll while it holds fewer than
 * skip_below entries. */
static inline stash_status_t _stash_events_poll_fewer(stash_heap_t* h, stash_events_t* e,
                                                      const stash_ev_poll_t* how,
                                                      stash_ev_done_fn done) {
  return e->nqueues ? _stash_events_poll_queues(h, e, false, done, how) : STASH_OK;
}
/* The event recorded last on `stream` that is still queued (it follows every other queued
 * for that stream), in *event; false when none is (or it waits for a capture to end). */
STASH_HIDDEN bool _stash_events_last(const stash_events_t* e, void* stream, uint64_t* event);
/* How many entries stream's queue holds. */
STASH_HIDDEN size_t _stash_events_queued(const stash_events_t* e, void* stream);
STASH_HIDDEN void _stash_events_foreach(const stash_events_t* e,
                                        void (*fn)(void* item, void* arg), void* arg);
/* Add stream to a block's list of streams it was used on (once): record_stream. */
STASH_HIDDEN stash_status_t _stash_uses_add(void*** uses, uint32_t* n, uint32_t* cap,
                                            void* stream);
/* Destroy every event (queued or pooled); returns the first error. */
STASH_HIDDEN stash_status_t _stash_events_destroy(stash_heap_t* h, stash_events_t* e);

/* ---- zombies.c: memory the driver refused to take back, retried later ------------------- */

typedef struct stash_zombie_s {
  uint64_t va;     /* a mapping still to unmap (0: none) */
  size_t size;     /* its size (or the memory's, for the message when it is lost) */
  uint64_t handle; /* a physical allocation still to release (0: none) */
} stash_zombie_t;

typedef struct stash_zombies_s {
  stash_zombie_t* v;
  size_t n, cap;
} stash_zombies_t;

STASH_HIDDEN void _stash_zombies_add(stash_zombies_t* z, uint64_t va, size_t size,
                                     uint64_t handle);
/* Try again to unmap, then release, every zombie; keeps those the driver still refuses and
 * returns the first error. */
STASH_HIDDEN stash_status_t _stash_zombies_release(stash_heap_t* h, stash_zombies_t* z);
/* Whether a zombie mapping lies inside [base, base+size). */
STASH_HIDDEN bool _stash_zombies_within(const stash_zombies_t* z, uint64_t base, size_t size);
STASH_HIDDEN void _stash_zombies_free(stash_zombies_t* z);

/* ---- history.c: the ring buffer of recorded events ---------------------------------------- */

typedef struct stash_history_s {
  stash_trace_entry_t* v; /* cap entries; NULL when not recording */
  size_t cap, count, next; /* next: where the next entry goes */
} stash_history_t;

/* Record one event if the heap records history (lock held). */
STASH_HIDDEN void _stash_history_add_(stash_heap_t* h, stash_trace_action_t action,
                                      uint64_t address, size_t size, void* stream);
#define _stash_history_add(h, action, address, size, stream)                     \
  do {                                                                          \
    if ((h)->history.cap || atomic_load_explicit(&_stash_tracing, memory_order_relaxed)) \
      _stash_history_add_((h), (action), (address), (size), (stream));          \
  } while (0)
/* STASH_TRACE=path: log every heap's allocations and frees in RMM's CSV format there ("%d"
 * in the path: one file per device). Read once, when the first heap is made. */
STASH_HIDDEN extern _Atomic bool _stash_tracing;
STASH_HIDDEN void _stash_trace_start(void);
STASH_HIDDEN void _stash_trace_flush(void);
STASH_HIDDEN void _stash_history_free(stash_history_t* hist);

/* ---- oom.c ------------------------------------------------------------------------------ */

/* Count an out-of-memory failure, record it, and set the error message: orig bytes asked
 * for (needed: what the policy would have had to get, e.g. "a segment of 20.00 MiB", or
 * NULL), the device's free memory, and the heap's allocated, unused and largest free
 * block, then `advice` (a sentence, or NULL). Lock held. Returns STASH_ERR_OOM. */
STASH_HIDDEN stash_status_t _stash_report_oom(stash_heap_t* h, size_t orig, void* stream,
                                              const char* needed, size_t largest_free,
                                              const char* advice);

/* Keep the first failure of several steps: first = first or x's status. */
#define _STASH_KEEP_FIRST(first, x)                       \
  do {                                                    \
    stash_status_t r_ = (x);                              \
    if (r_ != STASH_OK && (first) == STASH_OK) (first) = r_; \
  } while (0)

/* ---- heap.c: the heap object shared by the policies -------------------------------------- */

typedef struct stash_policy_ops_s stash_policy_ops_t;

struct stash_heap_s {
  pthread_mutex_t lock;          /* guards everything below */
  stash_conf_t conf;             /* immutable after creation */
  stash_provider_t prov;         /* copy of the provider table */
  int device;
  size_t device_total;           /* the device's total memory (provider mem_info at creation) */
  size_t granularity;            /* provider page size */
  bool has_limit;                /* a memory fraction < 1 is set */
  size_t allowed_max;            /* bytes the heap may reserve when has_limit */
  size_t total_reserved;         /* bytes reserved from the provider (PyTorch's
                                    total_allocated_memory) */
  stash_stats_t stats;
  stash_history_t history;       /* recorded events, when asked for */
  int capturing;                 /* CUDA graph captures underway on the device (events.c) */
  const stash_policy_ops_t* policy;
  void* policy_state;
};

/* The policies: a table each (SQLite-style), chosen by conf.policy. */
struct stash_policy_ops_s {
  const char* name;
  stash_status_t (*create)(stash_heap_t* h);
  /* Give everything back to the provider; returns the first error. */
  stash_status_t (*destroy)(stash_heap_t* h);
  stash_status_t (*alloc)(stash_heap_t* h, size_t size, void* stream, uint64_t* out);
  stash_status_t (*free)(stash_heap_t* h, uint64_t ptr);
  stash_status_t (*record_stream)(stash_heap_t* h, uint64_t ptr, void* stream);
  stash_status_t (*empty_cache)(stash_heap_t* h);
  stash_status_t (*visit)(stash_heap_t* h, stash_visit_fn fn, void* arg);
  stash_status_t (*check)(stash_heap_t* h);
};

STASH_HIDDEN extern const stash_policy_ops_t _stash_policy_pytorch;
STASH_HIDDEN extern const stash_policy_ops_t _stash_policy_stash;

/* ---- conf.c ------------------------------------------------------------------------------- */

/* Check a configuration's ranges (for structs filled by hand). */
STASH_HIDDEN stash_status_t _stash_conf_validate(const stash_conf_t* conf);
STASH_HIDDEN const char* _stash_policy_name(stash_policy_t p);


#endif /* STASH_INTERNAL_H */
