/* fate.c: what became, one training step earlier, of the allocation about to be made - so
 * that the policy can put the blocks that will be freed together next to each other.
 *
 * A language model's forward pass lays its activations down layer by layer; some live until
 * the backward pass, others (Hugging Face Llama's key/value cache, returned for every layer)
 * are freed together just before the logits, the step's largest tensors. Placed in the order
 * they come, the two kinds alternate, and the logits find the freed ones as many holes of a
 * few tens of MiB between live blocks, none of which they fit: the arena grows by the whole
 * logits. Placed apart - the ones that will be freed at the top of the free memory, the ones
 * that stay at the bottom - the freed ones leave one free stretch at the arena's top, which the
 * logits take with little or no growth (docs/policy-stash.md, "Twenty-seventh session").
 *
 * Which kind a block is shows only a step later: this file remembers, for every large
 * allocation of a step up to its first huge request, when it was made, and when a block of
 * its key was first freed after that; the key is its size and the four large events before
 * it (the loop detector's rolling hash: a layer's allocations repeat, so a key names "this
 * tensor of a layer", and the last layer's allocation with it answers for all). For an allocation of the next step with the
 * same key it answers what its counterpart did around the step's huge requests (kHuge or
 * more): freed between the first and the last of them (STASH_FATE_AROUND_HUGE), or living
 * past the last (STASH_FATE_STAYS). Allocations made after the first huge request, freed
 * before it, or without a counterpart are STASH_FATE_UNKNOWN, as is everything in a step after
 * one without a huge request: the policy places them by its other rules.
 *
 * Steps: a step ends when live bytes fall under 1/kQuiet of the most it held (after at least
 * kMinPeak); the next step's table starts there (an optimizer's update, made in the trough,
 * is the next step's), and its peak is followed once live bytes rise past half of the last
 * step's again.
 *
 * A step with no huge request may still have requests huge for it: kRelHuge or more, at least
 * half its largest, made while live bytes were at least half the way from its floor (the
 * fewest live since the last step ended) to its peak, and kRelAfter large events or more into
 * it (a smaller model's logits; not a vision model's first activation) - known when the step
 * ends, which it also does under half the way from its floor to its peak (a small model's
 * weights and optimizer state keep live bytes over a quarter). The second step after such a
 * step holds more than it (the optimizer's state) and would grow as it goes, new memory coming
 * above the blocks placed at the top and at the bottom alike; at its first request whose
 * counterpart went around the huge requests this file predicts its peak - its floor so far plus
 * what the first step held above its own - for the policy to grow to at once
 * (_stash_fate_take_growth; docs/policy-stash.md, "Fates while the arena grows").
 *
 * Requests of kRelSmall to kRelHuge may be huge for a step too, but only in a run whose live
 * bytes have never fallen to half their peak: a small model whose weights and optimizer state
 * outweigh its activations (Llama b1's 125 MiB logits). T5-small's 125.5 MiB logits and the
 * large activations of Swin and ViT come in runs that halve: once halved, such requests no
 * longer count, and a step whose huge requests were all of them gives no fates. Such a run's
 * first step would end only once live bytes fell under half its peak, and the weights it loads
 * keep them over that; its floor, for ending it, is the live bytes at the last large request
 * before the first recorded block is freed (the weights loaded).
 *
 * Memory: two steps' tables of 32-byte slots, 2-4 slots per key; a failed host allocation
 * turns this off, which only ends the predictions.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define kHuge ((size_t)512 << 20) /* a huge request: the logits of a language model */
#define kQuiet 4                  /* a step ends under 1/kQuiet of its peak live bytes */
#define kMinPeak ((int64_t)256 << 20)
#define kRelHuge ((size_t)240 << 20) /* huge for a step: this much, at least half its largest */
#define kRelAfter 128                /* ... made this many large events or more into it */
#define kRelSmall ((size_t)120 << 20) /* ... or this much in a run that never halved */

void _stash_fate_init(stash_fate_t* F) { memset(F, 0, sizeof *F); }

void _stash_fate_free(stash_fate_t* F) {
  for (int i = 0; i < 2; i++) free(F->step[i].slots);
  _stash_fate_init(F);
}

static void disable(stash_fate_t* F) {
  _stash_fate_free(F);
  F->disabled = true;
}

static uint64_t key_of(uint64_t context, size_t size) {
  return _stash_mix64(context ^ _stash_mix64(size));
}

/* Whether slot x of step t holds a key: written (born 0: never) in t's generation. */
static bool used(const stash_fate_step_t* t, const stash_fate_slot_t* x) {
  return x->born && x->gen == t->gen;
}

/* The slot of key in step t: the one holding it, or the empty one where it would go (a table
 * is never more than half full). */
static stash_fate_slot_t* slot_of(const stash_fate_step_t* t, uint64_t key) {
  size_t mask = t->cap - 1, i = (size_t)key & mask;
  while (used(t, &t->slots[i]) && t->slots[i].key != key) i = (i + 1) & mask;
  return &t->slots[i];
}

/* Key's slot in step t, or NULL. */
static stash_fate_slot_t* find(const stash_fate_step_t* t, uint64_t key) {
  if (!t->cap) return NULL;
  stash_fate_slot_t* x = slot_of(t, key);
  return used(t, x) ? x : NULL;
}

/* Room for one more key in step t; false when the host is out of memory. */
static bool reserve(stash_fate_step_t* t) {
  if (2 * (t->nkeys + 1) <= t->cap) return true;
  size_t cap = t->cap ? 2 * t->cap : 512, old_cap = t->cap;
  stash_fate_slot_t* old = t->slots;
  if (!(t->slots = calloc(cap, sizeof *t->slots))) {
    t->slots = old;
    return false;
  }
  t->cap = cap;
  for (size_t i = 0; i < old_cap; i++)
    if (used(t, &old[i])) *slot_of(t, old[i].key) = old[i];
  free(old);
  return true;
}

bool _stash_fate_stepped(const stash_fate_t* F) { return F->nsteps > 0; }

int64_t _stash_fate_take_growth(stash_fate_t* F) {
  int64_t t = F->grow_to;
  F->grow_to = 0;
  return t;
}

/* Whether candidate i is huge for this step: at least half its largest, and kRelHuge or more
 * unless live bytes have never halved. */
static bool rel_huge(const stash_fate_t* F, int i) {
  return 2 * F->rel_size[i] >= F->largest && (F->rel_size[i] >= kRelHuge || !F->halved);
}

/* Whether this step's huge requests so far are all under kRelHuge. */
static bool rel_small(const stash_fate_t* F) {
  for (int i = 0; i < F->nrel; i++)
    if (rel_huge(F, i) && F->rel_size[i] >= kRelHuge) return false;
  return true;
}

/* The first request huge relative to this step so far (0: none, or one made too early in the
 * step to follow a forward pass: a vision model's first activations). */
static uint64_t rel_first(const stash_fate_t* F) {
  for (int i = 0; i < F->nrel; i++)
    if (rel_huge(F, i))
      return F->rel_clock[i] - F->step_start >= kRelAfter ? F->rel_clock[i] : 0;
  return 0;
}

/* A request of kRelSmall or more, made while live bytes are high: it may be huge for the step. */
static void rel_add(stash_fate_t* F, uint64_t clock, size_t size) {
  if (size < kRelSmall) return;
  if (F->nrel == 64) { /* forget those that can no longer be huge (the step's largest only
                         * grows, and a run that has halved stays so) */
    int k = 0;
    for (int i = 0; i < F->nrel; i++)
      if (rel_huge(F, i)) {
        F->rel_clock[k] = F->rel_clock[i];
        F->rel_size[k++] = F->rel_size[i];
      }
    F->nrel = k;
    if (k == 64) return;
  }
  F->rel_clock[F->nrel] = clock;
  F->rel_size[F->nrel++] = size;
}

/* Follow live bytes: end the step, or begin the next. */
static void follow(stash_fate_t* F, int64_t live) {
  if (live > F->peak_ever) F->peak_ever = live;
  if (F->peak_ever >= kMinPeak && 2 * live < F->peak_ever) F->halved = true;
  if (!F->between && live > F->peak) F->peak = live;
  if (live < F->floor) F->floor = live;
  stash_fate_step_t* cur = &F->step[F->nsteps & 1];
  uint64_t rel = cur->first_huge ? 0 : rel_first(F);
  /* a step with requests huge for it ends, too, under half the way from its floor to its
   * peak (a small model's weights and optimizer state keep live bytes over a quarter); the
   * first step's floor is 0, and where only requests under kRelHuge are huge for it (live
   * bytes never halved), what it loads keeps live bytes over half its peak: its floor is
   * then the live bytes once the weights were loaded (Llama b1) */
  int64_t floor = F->floor;
  if (rel && !F->nsteps && F->loaded && rel_small(F)) floor = F->loaded_live;
  bool end_rel = rel && F->peak - floor >= kMinPeak && 2 * (live - floor) < F->peak - floor;
  if (!F->between && ((F->peak >= kMinPeak && live * kQuiet < F->peak) || end_rel)) {
    F->between = true;
    F->prev_small = rel && rel_small(F);
    if (rel) /* the step's huge requests: those at least half its largest */
      for (int i = 0; i < F->nrel; i++) {
        if (!rel_huge(F, i)) continue;
        if (!cur->first_huge) cur->first_huge = F->rel_clock[i];
        cur->last_huge = F->rel_clock[i];
      }
    F->nrel = 0;
    F->step_start = F->clock;
    F->prev_had_huge = F->had_huge;
    F->had_huge = false;
    F->prev_peak = F->peak;
    F->prev_floor = F->floor;
    F->floor = live;
    F->largest = 0;
    F->nsteps++;
    F->grow_armed = F->nsteps == 1;
    stash_fate_step_t* t = &F->step[F->nsteps & 1]; /* the step before last: forgotten */
    t->gen++; /* its slots are empty now */
    t->nkeys = 0;
    t->first_huge = t->last_huge = 0;
  } else if (F->between && live * 2 > F->peak) {
    F->between = false;
    F->peak = live;
  }
}

void _stash_fate_live(stash_fate_t* F, int64_t live) {
  F->asked = false;
  if (!F->disabled) follow(F, live);
}

stash_fate_class_t _stash_fate_predict(stash_fate_t* F, uint64_t context, size_t size,
                                       int64_t live) {
  F->asked = false;
  if (F->disabled) return STASH_FATE_UNKNOWN;
  F->clock++;
  follow(F, live);
  if (context == STASH_LOOP_NONE) return STASH_FATE_UNKNOWN;
  F->asked = true; /* for _stash_fate_alloc */
  F->asked_key = key_of(context, size);
  F->asked_huge = size >= kHuge;
  F->asked_size = size;
  F->asked_live = live;
  if (size > F->largest) F->largest = size;
  if (!F->nsteps) return STASH_FATE_UNKNOWN;
  const stash_fate_step_t* prev = &F->step[(F->nsteps - 1) & 1];
  if (!prev->first_huge) return STASH_FATE_UNKNOWN;
  /* its huge requests were small ones, huge for it only while live bytes had not halved:
   * since they have, not a small model's logits (T5-small's, Swin's activations) */
  if (F->halved && F->prev_small) return STASH_FATE_UNKNOWN;
  const stash_fate_slot_t* r = find(prev, F->asked_key);
  if (!r || r->born > prev->first_huge) return STASH_FATE_UNKNOWN;
  if (r->freed && r->freed <= prev->first_huge) return STASH_FATE_UNKNOWN;
  bool around = r->freed && r->freed <= prev->last_huge;
  if (around && F->grow_armed && !F->prev_had_huge) {
    /* the second step's blocks begin to be placed apart: predict its peak */
    F->grow_armed = false;
    F->grow_to = F->floor + (F->prev_peak - F->prev_floor);
  }
  return around ? STASH_FATE_AROUND_HUGE : STASH_FATE_STAYS;
}

bool _stash_fate_alloc(stash_fate_t* F, uint64_t* key, uint32_t* step) {
  if (F->disabled || !F->asked) return false;
  F->asked = false;
  stash_fate_step_t* t = &F->step[F->nsteps & 1];
  if (!F->between && 2 * (F->asked_live - F->floor) >= F->peak - F->floor)
    rel_add(F, F->clock, F->asked_size);
  if (F->asked_huge) {
    F->had_huge = true;
    if (!t->first_huge) t->first_huge = F->clock;
    if (!F->between) t->last_huge = F->clock;
  }
  /* made after the step's first huge request: its counterpart could only ever answer
   * UNKNOWN, and the key keeps what its allocation before the logits did */
  if (t->first_huge && t->first_huge < F->clock) return false;
  if (!reserve(t)) {
    disable(F);
    return false;
  }
  stash_fate_slot_t* x = slot_of(t, F->asked_key);
  if (!used(t, x)) t->nkeys++;
  *x = (stash_fate_slot_t){F->asked_key, F->clock, 0, t->gen}; /* the latest allocation answers */
  *key = F->asked_key;
  *step = (uint32_t)F->nsteps;
  return true;
}

/* The free of a block marks its key's slot, if not yet marked: a key answers with when its
 * latest allocation was made and when a block of the key was first freed after that - for a
 * layer's tensor, when the last layer's was made and when the first layer's went (the same
 * as the latest block's own free where the layers' blocks go together; on a few T5 runs
 * better where they do not: docs/policy-stash.md, "Twenty-seventh session"). */
void _stash_fate_freed(stash_fate_t* F, uint64_t key, uint32_t step) {
  if (F->disabled) return;
  if (!F->loaded) { /* the first free of a recorded block: the weights are loaded */
    F->loaded = true;
    F->loaded_live = F->asked_live;
  }
  F->clock++;
  /* this step's allocation, or the previous step's; older ones are forgotten */
  uint32_t now = (uint32_t)F->nsteps;
  if (step != now && step + 1 != now) return;
  stash_fate_slot_t* x = find(&F->step[step & 1], key);
  if (x && !x->freed) x->freed = F->clock;
}
