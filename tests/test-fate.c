/* test-fate: what the previous training step's counterpart of an allocation did (src/fate.c),
 * which policy:stash uses to put the blocks freed around the logits together. */
#include <stdlib.h>

#include "internal.h"
#include "testhelper.h"

#define MiB ((size_t)1 << 20)
#define HUGE (600 * MiB) /* over fate.c's kHuge, 512 MiB */

typedef struct {
  bool recorded;
  uint64_t key;
  uint32_t step;
} block_t;

/* Predict, then record, an allocation (as policy:stash does); the class through *cls. */
static block_t alloc(stash_fate_t* F, uint64_t ctx, size_t size, int64_t live,
                     stash_fate_class_t* cls) {
  stash_fate_class_t c = _stash_fate_predict(F, ctx, size, live);
  if (cls) *cls = c;
  block_t b = {false, 0, 0};
  b.recorded = _stash_fate_alloc(F, &b.key, &b.step);
  return b;
}

static void freed(stash_fate_t* F, block_t b) {
  if (b.recorded) _stash_fate_freed(F, b.key, b.step);
}

/* The end of a step: live bytes fall under a quarter of its peak (the next step begins once
 * they rise past half of it again: within the next step's allocations). */
static void next_step(stash_fate_t* F) { _stash_fate_live(F, 10 * (int64_t)MiB); }

/* End the step, then ask what the next step's allocation with this key gets. */
static stash_fate_class_t next_steps_class(stash_fate_t* F, uint64_t ctx, size_t size) {
  next_step(F);
  stash_fate_class_t c = STASH_FATE_UNKNOWN;
  alloc(F, ctx, size, 300 * (int64_t)MiB, &c);
  return c;
}

/* One step of a small "language model": four layers, each keeping an activation (context 1,
 * live until the end) beside a key/value block (context 2, freed between the two logits),
 * and a temporary (context 3, freed at once); then two huge logits and a block made after
 * them (context 6). */
static void model_step(stash_fate_t* F, stash_fate_class_t cls[7]) {
  block_t act[4], kv[4];
  for (int l = 0; l < 4; l++) { /* live bytes (made up, rising) as the policy passes them */
    int64_t live = (100 + 300 * l) * (int64_t)MiB;
    act[l] = alloc(F, 1, 10 * MiB, live, &cls[1]);
    kv[l] = alloc(F, 2, 24 * MiB, live + 100 * (int64_t)MiB, &cls[2]);
    block_t tmp = alloc(F, 3, 8 * MiB, live + 200 * (int64_t)MiB, &cls[3]);
    freed(F, tmp);
  }
  block_t logits1 = alloc(F, 4, HUGE, 1300 * (int64_t)MiB, &cls[4]);
  for (int l = 0; l < 4; l++) freed(F, kv[l]);
  block_t logits2 = alloc(F, 5, HUGE, 1900 * (int64_t)MiB, &cls[5]);
  block_t late = alloc(F, 6, 16 * MiB, 2500 * (int64_t)MiB, &cls[6]);
  freed(F, logits1);
  freed(F, logits2);
  freed(F, late);
  for (int l = 0; l < 4; l++) freed(F, act[l]);
}

TEST(a_step_learns_what_the_last_one_did_around_its_huge_requests) {
  stash_fate_t F;
  _stash_fate_init(&F);
  stash_fate_class_t c[7];
  model_step(&F, c); /* the first step: nothing to learn from */
  for (int k = 1; k <= 6; k++) CHECK_EQ(c[k], STASH_FATE_UNKNOWN);
  next_step(&F);
  CHECK_EQ(F.nsteps, 1);
  for (int s = 0; s < 3; s++) {
    model_step(&F, c);
    CHECK_EQ(c[1], STASH_FATE_STAYS);       /* the activations: live past the last logits */
    CHECK_EQ(c[2], STASH_FATE_AROUND_HUGE); /* the key/value blocks: freed between them */
    CHECK_EQ(c[3], STASH_FATE_UNKNOWN);     /* freed before the first logits */
    CHECK_EQ(c[4], STASH_FATE_STAYS);       /* the first logits: freed after the last */
    CHECK_EQ(c[5], STASH_FATE_UNKNOWN);     /* made after the first huge request */
    CHECK_EQ(c[6], STASH_FATE_UNKNOWN);
    next_step(&F);
  }
  /* another size after the same events, or another context: no counterpart */
  CHECK_EQ(_stash_fate_predict(&F, 2, 25 * MiB, 200 * (int64_t)MiB), STASH_FATE_UNKNOWN);
  CHECK_EQ(_stash_fate_predict(&F, 77, 24 * MiB, 200 * (int64_t)MiB), STASH_FATE_UNKNOWN);
  _stash_fate_free(&F);
}

/* A model step, with (extra) one more block before it, of a key no other step has (context 9),
 * that lives past the step's last huge request - freed at its end (free_it), or left live;
 * then the step's end. */
static void step_with_extra(stash_fate_t* F, bool extra, bool free_it) {
  stash_fate_class_t c[7];
  block_t x = {false, 0, 0};
  if (extra) x = alloc(F, 9, 12 * MiB, 50 * (int64_t)MiB, NULL);
  model_step(F, c);
  if (free_it) freed(F, x);
  next_step(F);
}

TEST(a_step_answers_from_its_own_table_not_one_of_two_steps_before) {
  /* Two tables take turns: the step after next writes in the table of the step before - which
   * must hold none of that step's keys (a step's end empties the table the next step writes
   * in). A key made only in the first of four steps, by a block that lives on (which would
   * answer "stays"): the fourth step predicts from the third's table, the first's again. */
  for (int control = 0; control < 2; control++) {
    stash_fate_t F;
    _stash_fate_init(&F);
    step_with_extra(&F, true, false);
    step_with_extra(&F, false, false);
    step_with_extra(&F, control, true); /* the control makes the key in the third step too */
    CHECK_EQ(F.nsteps, 3);
    CHECK_EQ(_stash_fate_predict(&F, 9, 12 * MiB, 50 * (int64_t)MiB),
             control ? STASH_FATE_STAYS : STASH_FATE_UNKNOWN);
    _stash_fate_free(&F);
  }
}

TEST(a_step_without_a_huge_request_teaches_nothing) {
  stash_fate_t F;
  _stash_fate_init(&F);
  stash_fate_class_t c = STASH_FATE_UNKNOWN;
  block_t a = alloc(&F, 1, 10 * MiB, 300 * (int64_t)MiB, NULL);
  block_t b = alloc(&F, 2, 400 * MiB, 700 * (int64_t)MiB, NULL); /* under kHuge */
  freed(&F, a);
  freed(&F, b);
  CHECK_EQ(next_steps_class(&F, 1, 10 * MiB), STASH_FATE_UNKNOWN);
  alloc(&F, 2, 400 * MiB, 700 * (int64_t)MiB, &c);
  CHECK_EQ(c, STASH_FATE_UNKNOWN);
  _stash_fate_free(&F);
}

TEST(steps_end_under_a_quarter_of_the_peak_and_begin_past_half) {
  stash_fate_t F;
  _stash_fate_init(&F);
  _stash_fate_live(&F, 200 * (int64_t)MiB); /* a peak under 256 MiB ends no step */
  _stash_fate_live(&F, 0);
  CHECK_EQ(F.nsteps, 0);
  _stash_fate_live(&F, 1000 * (int64_t)MiB);
  _stash_fate_live(&F, 251 * (int64_t)MiB); /* a quarter and more: the same step */
  CHECK_EQ(F.nsteps, 0);
  _stash_fate_live(&F, 249 * (int64_t)MiB);
  CHECK_EQ(F.nsteps, 1);
  CHECK(F.between);
  _stash_fate_live(&F, 100 * (int64_t)MiB); /* still between: no second end */
  _stash_fate_live(&F, 499 * (int64_t)MiB);
  CHECK(F.between);
  _stash_fate_live(&F, 501 * (int64_t)MiB); /* past half: the next step's peak starts here */
  CHECK(!F.between);
  CHECK_EQ(F.peak, 501 * (int64_t)MiB);
  _stash_fate_live(&F, 126 * (int64_t)MiB);
  CHECK_EQ(F.nsteps, 1);
  _stash_fate_live(&F, 125 * (int64_t)MiB);
  CHECK_EQ(F.nsteps, 2);
  _stash_fate_free(&F);
}

TEST(a_key_answers_with_its_latest_allocation_and_the_first_free_after_it) {
  /* two blocks with one key: freed, the first, before the second is made - the second's own
   * life decides (it stays); or after it - that free decides (around the huge requests) */
  for (int order = 0; order < 2; order++) {
    stash_fate_t F;
    _stash_fate_init(&F);
    block_t a = alloc(&F, 9, 12 * MiB, 300 * (int64_t)MiB, NULL);
    if (order == 0) freed(&F, a);
    block_t b = alloc(&F, 9, 12 * MiB, 300 * (int64_t)MiB, NULL);
    block_t h1 = alloc(&F, 4, HUGE, 900 * (int64_t)MiB, NULL);
    if (order == 1) freed(&F, a);
    block_t h2 = alloc(&F, 5, HUGE, 1500 * (int64_t)MiB, NULL);
    freed(&F, h1);
    freed(&F, h2);
    freed(&F, b);
    CHECK_EQ(next_steps_class(&F, 9, 12 * MiB),
             order == 0 ? STASH_FATE_STAYS : STASH_FATE_AROUND_HUGE);
    _stash_fate_free(&F);
  }
}

TEST(allocations_after_the_first_huge_request_are_not_recorded) {
  /* a key allocated before the first logits (its block freed between them) and again after
   * them: the later allocation leaves the earlier answer standing */
  stash_fate_t F;
  _stash_fate_init(&F);
  block_t a = alloc(&F, 8, 16 * MiB, 300 * (int64_t)MiB, NULL);
  block_t h1 = alloc(&F, 4, HUGE, 900 * (int64_t)MiB, NULL);
  freed(&F, a);
  block_t b = alloc(&F, 8, 16 * MiB, 900 * (int64_t)MiB, NULL);
  CHECK(!b.recorded);
  block_t h2 = alloc(&F, 5, HUGE, 1500 * (int64_t)MiB, NULL);
  CHECK(!h2.recorded);
  freed(&F, b);
  freed(&F, h1);
  freed(&F, h2);
  CHECK_EQ(next_steps_class(&F, 8, 16 * MiB), STASH_FATE_AROUND_HUGE);
  _stash_fate_free(&F);
}

TEST(an_allocation_without_context_is_not_recorded) {
  stash_fate_t F;
  _stash_fate_init(&F);
  CHECK_EQ(_stash_fate_predict(&F, STASH_LOOP_NONE, 10 * MiB, 0), STASH_FATE_UNKNOWN);
  uint64_t key = 0;
  uint32_t step = 0;
  CHECK(!_stash_fate_alloc(&F, &key, &step));
  CHECK_EQ(F.step[0].nkeys, 0);
  _stash_fate_free(&F);
}

TEST(a_block_of_two_steps_back_marks_nothing) {
  /* a block made in step 0 and freed in step 2, whose table step 2 reuses, with its key */
  stash_fate_t F;
  _stash_fate_init(&F);
  block_t old = alloc(&F, 1, 10 * MiB, 300 * (int64_t)MiB, NULL);
  alloc(&F, 4, HUGE, 900 * (int64_t)MiB, NULL);
  next_step(&F);
  alloc(&F, 4, HUGE, 900 * (int64_t)MiB, NULL);
  next_step(&F);
  CHECK_EQ(F.nsteps, 2);
  block_t now = alloc(&F, 1, 10 * MiB, 300 * (int64_t)MiB, NULL);
  CHECK(now.key == old.key);
  CHECK(now.step == old.step + 2);
  freed(&F, old); /* step 0's: forgotten, must not mark step 2's key */
  alloc(&F, 4, HUGE, 900 * (int64_t)MiB, NULL);
  /* "now" lives on (marked freed: UNKNOWN, before the huge request) */
  CHECK_EQ(next_steps_class(&F, 1, 10 * MiB), STASH_FATE_STAYS);
  _stash_fate_free(&F);
}

TEST(many_keys_grow_the_index_and_keep_their_answers) {
  /* 5000 layers' blocks, odd ones freed between the huge requests */
  enum { N = 5000 };
  static block_t ids[N];
  stash_fate_t F;
  _stash_fate_init(&F);
  for (int i = 0; i < N; i++)
    ids[i] = alloc(&F, 1000 + (uint64_t)i, 4 * MiB, 300 * (int64_t)MiB, NULL);
  alloc(&F, 4, HUGE, 900 * (int64_t)MiB, NULL);
  for (int i = 1; i < N; i += 2) freed(&F, ids[i]);
  alloc(&F, 5, HUGE, 1500 * (int64_t)MiB, NULL);
  for (int i = 0; i < N; i += 2) freed(&F, ids[i]);
  CHECK(F.step[0].cap >= 2 * (size_t)N);
  next_step(&F);
  int wrong = 0;
  for (int i = 0; i < N; i++)
    wrong += _stash_fate_predict(&F, 1000 + (uint64_t)i, 4 * MiB, 300 * (int64_t)MiB) !=
             (i % 2 ? STASH_FATE_AROUND_HUGE : STASH_FATE_STAYS);
  CHECK_EQ(wrong, 0);
  _stash_fate_free(&F);
}

/* A small model's step: weights and optimizer state (`base` MiB live) under 40 layers of an
 * activation (context 1, living on) and a key/value block (context 2, freed between the
 * logits) with a temporary each (context 3), then two logits of `logits` MiB (contexts 4 and
 * 5); the activations go, and live bytes fall back to base + 100 MiB. */
static void small_model_step(stash_fate_t* F, int64_t base, size_t logits,
                             stash_fate_class_t cls[3], int64_t* grow_to) {
  block_t act[40], kv[40];
  int64_t live = base;
  for (int l = 0; l < 40; l++) {
    act[l] = alloc(F, 1, 10 * MiB, live, &cls[1]);
    if (grow_to && !*grow_to) *grow_to = _stash_fate_take_growth(F);
    kv[l] = alloc(F, 2, 24 * MiB, live + 10 * (int64_t)MiB, &cls[2]);
    if (grow_to && !*grow_to) *grow_to = _stash_fate_take_growth(F);
    freed(F, alloc(F, 3, 8 * MiB, live + 34 * (int64_t)MiB, NULL));
    live += 34 * (int64_t)MiB;
  }
  block_t l1 = alloc(F, 4, logits * MiB, live, NULL);
  live += (int64_t)(logits * MiB);
  for (int l = 0; l < 40; l++) freed(F, kv[l]);
  live -= 40 * 24 * (int64_t)MiB;
  block_t l2 = alloc(F, 5, logits * MiB, live, NULL);
  freed(F, l1);
  freed(F, l2);
  for (int l = 0; l < 40; l++) freed(F, act[l]);
  _stash_fate_live(F, base + 100 * (int64_t)MiB);
}

TEST(a_small_models_logits_are_huge_for_its_step_and_its_second_step_grows_at_once) {
  /* logits of 300 MiB (under kHuge, over kRelHuge and half the step's largest): the step
   * ends under half the way from its floor (0: nothing before it) to its peak (live bytes
   * before the first logits: 1000 + 40 * 34 = 2360 MiB) - they never fall under a quarter of
   * it - and the next step learns from it; at its first block whose counterpart went between
   * the logits it is told to grow to its floor (1000 MiB, the trough) plus what the first step
   * held above its own */
  stash_fate_t F;
  _stash_fate_init(&F);
  stash_fate_class_t c[3];
  small_model_step(&F, 1000 * (int64_t)MiB, 300, c, NULL);
  CHECK_EQ(F.nsteps, 1);
  CHECK(F.step[0].first_huge != 0);
  CHECK_EQ(_stash_fate_take_growth(&F), 0);
  _stash_fate_live(&F, 1000 * (int64_t)MiB); /* the trough: the optimizer's update */
  _stash_fate_live(&F, 1600 * (int64_t)MiB); /* its state made */
  int64_t grow_to = 0;
  small_model_step(&F, 1600 * (int64_t)MiB, 300, c, &grow_to);
  CHECK_EQ(c[1], STASH_FATE_STAYS);
  CHECK_EQ(c[2], STASH_FATE_AROUND_HUGE);
  CHECK_EQ(grow_to, (1000 + 2360) * (int64_t)MiB);
  CHECK_EQ(F.nsteps, 2);
  /* once only: the third step places as the second did, but is told nothing */
  grow_to = 0;
  small_model_step(&F, 1600 * (int64_t)MiB, 300, c, &grow_to);
  CHECK_EQ(c[2], STASH_FATE_AROUND_HUGE);
  CHECK_EQ(grow_to, 0);
  _stash_fate_free(&F);

  /* logits under kRelSmall: no step ends, nothing is learnt */
  _stash_fate_init(&F);
  small_model_step(&F, 1000 * (int64_t)MiB, 100, c, NULL);
  CHECK_EQ(F.nsteps, 0);
  _stash_fate_free(&F);

  /* logits of kHuge or more: the steps as before, and no growth asked for */
  _stash_fate_init(&F);
  small_model_step(&F, 100 * (int64_t)MiB, 600, c, NULL);
  _stash_fate_live(&F, 10 * (int64_t)MiB);
  CHECK_EQ(F.nsteps, 1);
  grow_to = 0;
  small_model_step(&F, 100 * (int64_t)MiB, 600, c, &grow_to);
  CHECK_EQ(c[2], STASH_FATE_AROUND_HUGE);
  CHECK_EQ(grow_to, 0);
  _stash_fate_free(&F);
}

TEST(logits_under_kRelHuge_are_huge_for_a_step_only_while_live_bytes_never_halved) {
  /* Llama b1: 200 MiB logits (kRelSmall to kRelHuge) in a run whose weights (1500 MiB) keep
   * live bytes over half its peak (2860 MiB) - the first step ends only from the floor of its
   * weights loaded (1534 MiB, at the first free), not from 0 - and the second step learns
   * from it */
  stash_fate_t F;
  _stash_fate_init(&F);
  stash_fate_class_t c[3];
  small_model_step(&F, 1500 * (int64_t)MiB, 200, c, NULL);
  CHECK_EQ(F.nsteps, 1);
  CHECK(F.step[0].first_huge != 0);
  small_model_step(&F, 1500 * (int64_t)MiB, 200, c, NULL);
  CHECK_EQ(c[1], STASH_FATE_STAYS);
  _stash_fate_free(&F);

  /* T5-small, Swin: live bytes have halved (2000 -> 400 MiB, a step ended under a quarter):
   * the same 200 MiB requests are huge for no step, and the next one does not end at half
   * the way from its floor */
  _stash_fate_init(&F);
  _stash_fate_live(&F, 2000 * (int64_t)MiB);
  _stash_fate_live(&F, 400 * (int64_t)MiB);
  CHECK_EQ(F.nsteps, 1);
  small_model_step(&F, 1000 * (int64_t)MiB, 200, c, NULL);
  CHECK_EQ(F.nsteps, 1);
  CHECK_EQ(F.step[1].first_huge, 0);
  _stash_fate_free(&F);
}

TEST(a_request_huge_for_its_step_counts_only_after_a_forward_pass) {
  /* a vision model's first activation (300 MiB, its largest) comes first, then 60 smaller
   * blocks: no relative huge request, so live bytes at half the climb end no step */
  stash_fate_t F;
  _stash_fate_init(&F);
  block_t big = alloc(&F, 1, 300 * MiB, 1300 * (int64_t)MiB, NULL);
  for (int i = 0; i < 60; i++)
    freed(&F, alloc(&F, 2, 20 * MiB, 1600 * (int64_t)MiB, NULL));
  freed(&F, big);
  _stash_fate_live(&F, 700 * (int64_t)MiB);
  CHECK_EQ(F.nsteps, 0);
  _stash_fate_free(&F);
}

int main(void) {
  RUN(a_step_learns_what_the_last_one_did_around_its_huge_requests);
  RUN(a_step_without_a_huge_request_teaches_nothing);
  RUN(a_step_answers_from_its_own_table_not_one_of_two_steps_before);
  RUN(steps_end_under_a_quarter_of_the_peak_and_begin_past_half);
  RUN(a_key_answers_with_its_latest_allocation_and_the_first_free_after_it);
  RUN(allocations_after_the_first_huge_request_are_not_recorded);
  RUN(an_allocation_without_context_is_not_recorded);
  RUN(a_block_of_two_steps_back_marks_nothing);
  RUN(many_keys_grow_the_index_and_keep_their_answers);
  RUN(a_small_models_logits_are_huge_for_its_step_and_its_second_step_grows_at_once);
  RUN(a_request_huge_for_its_step_counts_only_after_a_forward_pass);
  RUN(logits_under_kRelHuge_are_huge_for_a_step_only_while_live_bytes_never_halved);
  TEST_MAIN_END();
}
