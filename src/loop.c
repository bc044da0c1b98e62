/* loop.c: notices that a program's large allocations repeat - a training loop - so that the
 * policy can give each allocation of a turn the address its counterpart got one turn
 * earlier ("turn replay"). A layout that repeats needs no more memory next turn; one that
 * drifts (best fit choosing a little differently each turn, as the blocks living across
 * the turn's start sit a little differently) eventually does, in the steady state.
 *
 * The policy reports every large allocation (its size and where it went) and every free.
 * Each event gets a code: an allocation of n bytes, or the free of the allocation made k
 * events earlier. The period P is found by matching: a hash of the last kWindow codes names
 * the previous event that ended the same codes, which proposes P; the proposal holds while
 * each new code equals the one P events earlier. The policy is offered a hint while a
 * proposal holds and the bytes live now equal those live P events ago (a repeating layer of
 * a forward pass repeats its codes but keeps adding bytes: not a turn) - from the kWindow-th
 * event of a training step that repeats the last one, not only once a whole turn has: the
 * layout replays from the first step that can repeat the last, before a step placed by
 * best fit alone drifts from it (a turn's first blocks placed by best fit take the places
 * the rest of the turn is then hinted to, and the turn after cascades off its hints). For
 * the same reason the window is short, 4 codes: the fewer of a turn's first events placed
 * before the proposal, the better (on 184 recorded traces, hints from the proposal on gave 52
 * lower peaks against 15 higher, and a window of 4 instead of 8 another 11 against 4; 3 to
 * 5 are alike: docs/policy-stash.md, "Ninth session").
 *
 * The forecast: each allocation also keeps the event that freed it, so that for
 * an allocation about to happen the policy can learn where the allocations that its
 * counterpart lived beside went one turn earlier - where they will likely want to go again
 * (the policy keeps a block whose own address is taken from landing there).
 *
 * Memory: the last kHistoryMax events (a loop of more than that many large events is not
 * seen); a failed host allocation turns the detector off, which only ends the hints.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define kWindow 4                    /* codes hashed to propose a period */
#define kTableBits 14
#define kTableSize ((size_t)1 << kTableBits) /* window hash -> the event ending it, + 1 */
#define kHashBase 0x100000001b3ull           /* the rolling hash's multiplier (odd) */
#define kHistoryMax ((size_t)1 << 16)
#define kMinPeriod 4
#define kPredecessorHops 4096 /* a live counterpart's predecessor: earlier ones of its size tried */

static uint64_t alloc_code(size_t size) { return _stash_mix64((uint64_t)size << 1); }
static uint64_t free_code(uint64_t age) { return _stash_mix64(age << 1 | 1); }

void _stash_loop_init(stash_loop_t* L) {
  memset(L, 0, sizeof *L);
  L->base_pow = 1;
  for (int i = 0; i < kWindow; i++) L->base_pow *= kHashBase;
}

void _stash_loop_free(stash_loop_t* L) {
  free(L->ev);
  free(L->table);
  free(L->last_of);
  _stash_loop_init(L);
}

static void disable(stash_loop_t* L) {
  _stash_loop_free(L);
  L->disabled = true;
}

/* Event e's record. The records are a ring: L->cap is a power of two (1024 doubled) that
 * grows only while nothing has been dropped (events [0, n) at [0, n)), and is kHistoryMax once
 * the older half is first dropped - which then moves the base, not the records. */
static stash_loop_ev_t* at(const stash_loop_t* L, uint64_t e) { return &L->ev[e & (L->cap - 1)]; }

/* Append an event; false when the host is out of memory (the detector is then off). */
static bool push(stash_loop_t* L, uint64_t code, int64_t delta, uint64_t offset) {
  if (L->n == kHistoryMax) { /* keep the newer half */
    size_t keep = kHistoryMax / 2;
    L->base += L->n - keep;
    L->n = keep;
  }
  if (L->n == L->cap) {
    stash_loop_ev_t* v = _stash_array_grow(L->ev, &L->cap, L->n + 1, sizeof *v, 1024);
    if (!v) return false;
    L->ev = v;
    if (!L->table && !(L->table = calloc(kTableSize, sizeof *L->table))) return false;
    if (!L->last_of && !(L->last_of = calloc(kTableSize, sizeof *L->last_of))) return false;
  }
  L->live += delta;
  *at(L, L->base + L->n++) = (stash_loop_ev_t){code, offset, L->live, 0, 0};
  return true;
}

/* The slot of a hash in a table of kTableSize entries (Fibonacci hashing). */
static size_t table_slot(uint64_t h) {
  return (size_t)((h * 0x9e3779b97f4a7c15ull) >> (64 - kTableBits));
}

/* Whether events e and f < e (both held) free the same number of bytes. */
static bool same_free(const stash_loop_t* L, uint64_t e, uint64_t f) {
  if (f <= L->base) return false; /* the event before f is not held */
  int64_t de = at(L, e)->live - at(L, e - 1)->live, df = at(L, f)->live - at(L, f - 1)->live;
  return de < 0 && de == df;
}

/* After event e: follow the period, or propose one. A free whose code differs from the event
 * a period earlier still follows it when that event freed as many bytes: the ages of blocks
 * living across a turn's start differ when earlier turns had other lengths (a first step that
 * also made the optimizer's state), and breaking there leaves the next turn's first blocks
 * without hints (six traces' peaks 2-63 MB lower, none higher: docs/policy-stash.md,
 * "Twenty-second session"). `code`: event e's. */
static void detect(stash_loop_t* L, uint64_t e, uint64_t code) {
  if (L->period && (e - L->base < L->period ||
                    (at(L, e - L->period)->code != code && !same_free(L, e, e - L->period))))
    L->period = 0; /* the proposal broke */
  /* the hash of the last kWindow codes, rolled: sum of code * B^age */
  L->hash = L->hash * kHashBase + code;
  if (e - L->base >= kWindow) L->hash -= at(L, e - kWindow)->code * L->base_pow;
  if (e - L->base + 1 < kWindow) return;
  uint64_t* slot = &L->table[table_slot(L->hash)];
  if (!L->period && *slot && *slot - 1 >= L->base && e - (*slot - 1) >= kMinPeriod &&
      *slot - 1 < e) {
    /* propose p when the last kWindow codes do equal those p events before them (the hash
     * may collide) */
    uint64_t p = e - (*slot - 1), run = 0;
    while (run < kWindow && e - run - p >= L->base && e - run - p <= e &&
           at(L, e - run)->code == at(L, e - run - p)->code)
      run++;
    if (run == kWindow) L->period = p;
  }
  *slot = e + 1;
}

uint64_t _stash_loop_alloc(stash_loop_t* L, size_t size, uint64_t offset) {
  if (L->disabled) return STASH_LOOP_NONE;
  uint64_t code = alloc_code(size);
  if (!push(L, code, (int64_t)size, offset)) {
    disable(L);
    return STASH_LOOP_NONE;
  }
  uint64_t e = L->base + L->n - 1;
  /* link it to the last allocation of its size (a slot another size took breaks the chain) */
  uint64_t* last = &L->last_of[table_slot(code)];
  if (*last && *last - 1 >= L->base && at(L, *last - 1)->code == code) at(L, e)->same = *last;
  *last = e + 1;
  detect(L, e, code);
  return e;
}

void _stash_loop_freed(stash_loop_t* L, uint64_t id, size_t size) {
  if (L->disabled) return;
  uint64_t e = L->base + L->n; /* this free's number */
  /* An allocation recorded before the detector failed (STASH_LOOP_NONE) has no age: a
   * code no allocation of the loop can have ends any proposal. */
  uint64_t code = id < e ? free_code(e - id) : _stash_mix64(UINT64_MAX);
  if (id < e && id >= L->base) at(L, id)->freed = e;
  if (!push(L, code, -(int64_t)size, STASH_LOOP_NONE)) {
    disable(L);
    return;
  }
  detect(L, e, code);
}

/* Whether the program is now at a point of a loop whose period holds where live bytes equal
 * those a turn before (where hints can be offered). */
static bool in_turn(const stash_loop_t* L) {
  uint64_t e = L->base + L->n, p = L->period;
  if (L->disabled || !p || e - L->base <= p) return false;
  return at(L, e - 1)->live == at(L, e - 1 - p)->live; /* else a layer repeating, not a turn */
}

/* The counterpart of the allocation of size bytes about to happen, within a loop whose
 * period holds and at the point of the turn where live bytes equal those a turn before: the
 * allocation one turn earlier - or, when that one still lives (a block that outlives its turn,
 * such as a prefetched batch, cannot have its counterpart's memory), the one it lived beside:
 * the latest allocation of its size made before it and freed after it was made, among the
 * kPredecessorHops allocations of its size before it and within two turns of it (each
 * allocation is linked to the one of its size before it: no scan of the events). In a loop
 * whose turns all align that is the allocation two turns earlier, and the layout repeats
 * every two turns; but the first turn often makes more allocations than the others (an
 * optimizer's state, made once), and then the one two turns back is not it
 * (data/traces/more/gpt2_b4: 272.6 MB less reserved). NULL otherwise. */
static const stash_loop_ev_t* counterpart(const stash_loop_t* L, size_t size) {
  uint64_t e = L->base + L->n, p = L->period; /* e: the allocation about to happen */
  if (!in_turn(L)) return NULL;
  uint64_t xe = e - p;
  const stash_loop_ev_t* x = at(L, xe);
  if (x->code != alloc_code(size)) return NULL;
  if (!x->freed) { /* it lives on: its memory is taken */
    uint64_t j = x->same;
    for (int hops = 0; j && j - 1 >= L->base && xe - (j - 1) <= 2 * p && hops < kPredecessorHops;
         hops++) {
      const stash_loop_ev_t* y = at(L, j - 1);
      if (y->freed > xe) return y;
      j = y->same;
    }
  }
  return x;
}

bool _stash_loop_hint(const stash_loop_t* L, size_t size, uint64_t* offset) {
  const stash_loop_ev_t* x = counterpart(L, size);
  if (!x || x->offset == STASH_LOOP_NONE) return false;
  *offset = x->offset;
  return true;
}

/* The event number of record x (held). */
static uint64_t counterpart_event(const stash_loop_t* L, const stash_loop_ev_t* x) {
  uint64_t mask = L->cap - 1;
  return L->base + (((uint64_t)(x - L->ev) - L->base) & mask);
}

bool _stash_loop_forecast(const stash_loop_t* L, size_t size, uint64_t (*out)[2], size_t max,
                          size_t* n) {
  const stash_loop_ev_t* x = counterpart(L, size);
  *n = 0;
  if (!x) return false;
  uint64_t e = L->base + L->n, from = counterpart_event(L, x) + 1;
  uint64_t to = x->freed && x->freed < e ? x->freed : e; /* the counterpart's life, this far */
  for (uint64_t j = from; j < to && *n < max; j++) {
    const stash_loop_ev_t* y = at(L, j); /* j > x's event >= base: j - 1 is held too */
    if (y->offset < STASH_LOOP_ELSEWHERE) { /* one in the arena: its bytes from live's */
      out[*n][0] = y->offset;
      out[(*n)++][1] = (uint64_t)(y->live - at(L, j - 1)->live);
    }
  }
  return true;
}

uint64_t _stash_loop_context(const stash_loop_t* L) {
  return L->disabled ? STASH_LOOP_NONE : L->hash;
}
