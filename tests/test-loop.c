/* test-loop: the loop detector behind policy:stash's turn replay (src/loop.c). */
#include <stdlib.h>

#include "internal.h"
#include "testhelper.h"

#define MiB ((size_t)1 << 20)

/* One turn: 12 events - 6 allocations, each pair freed after it is made - leaving nothing
 * live. */
static const size_t kSizes[6] = {10 * MiB, 20 * MiB, 5 * MiB, 7 * MiB, 3 * MiB, 9 * MiB};

/* Run one turn, placing allocation i at base + i * 32 MiB; for each allocation, ask for a
 * hint first and count those that name the previous turn's offset (want_base). */
static int turn(stash_loop_t* L, uint64_t base, uint64_t want_base, int* hints) {
  uint64_t ids[6];
  int right = 0;
  *hints = 0;
  for (int i = 0; i < 6; i++) {
    uint64_t off = 0;
    if (_stash_loop_hint(L, kSizes[i], &off)) {
      (*hints)++;
      right += off == want_base + (uint64_t)i * 32 * MiB;
    }
    ids[i] = _stash_loop_alloc(L, kSizes[i], base + (uint64_t)i * 32 * MiB);
    if (i % 2 == 1) { /* free the two just made, the older first */
      _stash_loop_freed(L, ids[i - 1], kSizes[i - 1]);
      _stash_loop_freed(L, ids[i], kSizes[i]);
    }
  }
  return right;
}

TEST(hints_name_the_previous_turn_once_its_events_repeat) {
  /* A turn is 12 events. The second turn's first 4 events (loop.c's kWindow: two allocations
   * and their frees) repeat the first's, which proposes the period: its last four allocations
   * are hinted already, the first turn's offsets - the layout replays from the second turn
   * on, not from the third (where a turn placed by best fit alone could have drifted from the
   * second). */
  stash_loop_t L;
  _stash_loop_init(&L);
  int hints = 0;
  for (int t = 0; t < 10; t++) {
    int right = turn(&L, (uint64_t)t * 1000 * MiB, (uint64_t)(t - 1) * 1000 * MiB, &hints);
    CHECK_EQ(right, hints); /* a hint, when there is one, is the previous turn's offset */
    CHECK_EQ(hints, t == 0 ? 0 : t == 1 ? 4 : 6);
  }
  CHECK_EQ(L.period, 12);
  _stash_loop_free(&L);
}

TEST(a_repeating_layer_that_keeps_bytes_is_not_a_turn) {
  /* a forward pass: each layer keeps a 10 MiB activation and frees two temporaries - the
   * codes repeat every 5 events, but live bytes grow */
  stash_loop_t L;
  _stash_loop_init(&L);
  int hints = 0;
  for (int layer = 0; layer < 200; layer++) {
    uint64_t off = 0, at = (uint64_t)layer * 16 * MiB;
    hints += _stash_loop_hint(&L, 10 * MiB, &off);
    _stash_loop_alloc(&L, 10 * MiB, at);
    hints += _stash_loop_hint(&L, 2 * MiB, &off);
    uint64_t t1 = _stash_loop_alloc(&L, 2 * MiB, at + 10 * MiB);
    hints += _stash_loop_hint(&L, 3 * MiB, &off);
    uint64_t t2 = _stash_loop_alloc(&L, 3 * MiB, at + 12 * MiB);
    _stash_loop_freed(&L, t1, 2 * MiB);
    _stash_loop_freed(&L, t2, 3 * MiB);
  }
  CHECK_EQ(hints, 0);
  CHECK_EQ(L.period, 5); /* the codes do repeat */
  _stash_loop_free(&L);
}

TEST(a_change_ends_the_hints_until_the_turn_repeats_again) {
  stash_loop_t L;
  _stash_loop_init(&L);
  int hints = 0;
  for (int t = 0; t < 6; t++) turn(&L, (uint64_t)t * 1000 * MiB, 0, &hints);
  CHECK_EQ(hints, 6);
  uint64_t off = 0;
  CHECK(!_stash_loop_hint(&L, 11 * MiB, &off)); /* not what the turn does next */
  uint64_t odd = _stash_loop_alloc(&L, 11 * MiB, 0);
  _stash_loop_freed(&L, odd, 11 * MiB);
  turn(&L, 6000 * MiB, 0, &hints);
  CHECK_EQ(hints, 4); /* the period broke: back after 4 events that repeat */
  for (int t = 7; t < 12; t++) turn(&L, (uint64_t)t * 1000 * MiB, (uint64_t)(t - 1) * 1000 * MiB, &hints);
  CHECK_EQ(hints, 6); /* back */
  _stash_loop_free(&L);
}

TEST(allocations_placed_unknown_get_no_hint) {
  /* an allocation whose place is STASH_LOOP_NONE: its counterpart is not hinted */
  stash_loop_t L;
  _stash_loop_init(&L);
  int hinted = 0, asked = 0;
  for (int t = 0; t < 8; t++) {
    for (int i = 0; i < 4; i++) {
      uint64_t off = 0;
      bool big = i == 2;
      if (t >= 5) {
        asked++;
        hinted += _stash_loop_hint(&L, big ? 300 * MiB : (size_t)(i + 2) * MiB, &off);
      }
      uint64_t id = _stash_loop_alloc(&L, big ? 300 * MiB : (size_t)(i + 2) * MiB,
                                      big ? STASH_LOOP_NONE : (uint64_t)i * 8 * MiB);
      _stash_loop_freed(&L, id, big ? 300 * MiB : (size_t)(i + 2) * MiB);
    }
  }
  CHECK_EQ(asked, 12);
  CHECK_EQ(hinted, 9); /* every turn, all but the one placed unknown */
  _stash_loop_free(&L);
}

/* A block that lives into the next turn (X, freed just after the next turn's X is made) is
 * freed at an age of about a turn; the first turn has no X to free (as a first step has no
 * optimizer state yet), so X's free in the second turn is younger than in the third, and the
 * codes differ. The proposal follows it anyway (the same bytes freed), so the blocks after it
 * in the third turn get their hints; breaking there, they got none. */
TEST(a_free_of_the_same_size_a_turn_earlier_keeps_the_turn) {
  stash_loop_t L;
  _stash_loop_init(&L);
  uint64_t x_prev = 0;
  int hints = 0, right = 0;
  for (int t = 0; t < 3; t++) {
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) {
      if (i == 2) { /* X, and the last turn's X freed */
        uint64_t x = _stash_loop_alloc(&L, 100 * MiB, (uint64_t)(t % 2) * 512 * MiB);
        if (t > 0) _stash_loop_freed(&L, x_prev, 100 * MiB);
        x_prev = x;
      }
      uint64_t off = 0;
      if (t == 2 && i >= 2 && _stash_loop_hint(&L, (size_t)(i + 1) * MiB, &off)) {
        hints++;
        right += off == 200 * MiB + (uint64_t)i * 8 * MiB;
      }
      ids[i] = _stash_loop_alloc(&L, (size_t)(i + 1) * MiB, 200 * MiB + (uint64_t)i * 8 * MiB);
    }
    for (int i = 0; i < 4; i++) _stash_loop_freed(&L, ids[i], (size_t)(i + 1) * MiB);
  }
  CHECK_EQ(hints, 2); /* the two made after X's free */
  CHECK_EQ(right, 2);
  _stash_loop_free(&L);
}

/* A place outside the arena (policy:stash: stitched range number n) is hinted as it was
 * given, and left out of forecasts, which are arena offsets and sizes. */
TEST(a_place_outside_the_arena_is_hinted_and_not_forecast) {
  stash_loop_t L;
  _stash_loop_init(&L);
  int right = 0;
  for (int t = 0; t < 8; t++) {
    uint64_t off = 0, fc[8][2];
    size_t n = 99;
    if (t >= 4) { /* the first allocation lives beside the other two; only the third is forecast */
      CHECK(_stash_loop_forecast(&L, 10 * MiB, fc, 8, &n));
      CHECK_EQ(n, 1);
      CHECK_EQ(fc[0][0], 64 * MiB);
      CHECK_EQ(fc[0][1], 20 * MiB);
    }
    uint64_t a = _stash_loop_alloc(&L, 10 * MiB, 0);
    if (t >= 4) { /* the range the last turn's counterpart went to */
      CHECK(_stash_loop_hint(&L, 300 * MiB, &off));
      right += off == (STASH_LOOP_ELSEWHERE | (uint64_t)t);
    }
    uint64_t b = _stash_loop_alloc(&L, 300 * MiB, STASH_LOOP_ELSEWHERE | (uint64_t)(t + 1));
    uint64_t c = _stash_loop_alloc(&L, 20 * MiB, 64 * MiB);
    _stash_loop_freed(&L, a, 10 * MiB);
    _stash_loop_freed(&L, b, 300 * MiB);
    _stash_loop_freed(&L, c, 20 * MiB);
  }
  CHECK_EQ(right, 4);
  _stash_loop_free(&L);
}

/* The forecast for allocation i of a turn: where the allocations made while its counterpart
 * lived went (turn(): a pair is freed after its second allocation). */
TEST(the_forecast_names_what_the_counterpart_lived_beside) {
  stash_loop_t L;
  _stash_loop_init(&L);
  int hints = 0;
  uint64_t fc[8][2];
  size_t n = 99;
  CHECK(!_stash_loop_forecast(&L, kSizes[0], fc, 8, &n)); /* no loop yet */
  CHECK_EQ(n, 0);
  for (int t = 0; t < 4; t++) turn(&L, (uint64_t)t * 1000 * MiB, 0, &hints);
  uint64_t prev = 3 * 1000 * MiB; /* the last turn's base */
  CHECK(!_stash_loop_forecast(&L, 11 * MiB, fc, 8, &n)); /* not the next allocation's size */
  /* allocation 0 lived beside allocation 1 (both freed after it) */
  CHECK(_stash_loop_forecast(&L, kSizes[0], fc, 8, &n));
  CHECK_EQ(n, 1);
  CHECK_EQ(fc[0][0], prev + 32 * MiB);
  CHECK_EQ(fc[0][1], kSizes[1]);
  CHECK(_stash_loop_forecast(&L, kSizes[0], fc, 0, &n)); /* at most max */
  CHECK_EQ(n, 0);
  uint64_t id0 = _stash_loop_alloc(&L, kSizes[0], 4000 * MiB);
  /* allocation 1: nothing was allocated after it before it was freed */
  CHECK(_stash_loop_forecast(&L, kSizes[1], fc, 8, &n));
  CHECK_EQ(n, 0);
  uint64_t id1 = _stash_loop_alloc(&L, kSizes[1], 4032 * MiB);
  _stash_loop_freed(&L, id0, kSizes[0]);
  _stash_loop_freed(&L, id1, kSizes[1]);
  /* allocation 2 beside allocation 3 */
  CHECK(_stash_loop_forecast(&L, kSizes[2], fc, 8, &n));
  CHECK_EQ(n, 1);
  CHECK_EQ(fc[0][0], prev + 3 * 32 * MiB);
  CHECK_EQ(fc[0][1], kSizes[3]);
  _stash_loop_free(&L);
}

TEST(a_block_that_outlives_its_turn_is_hinted_two_turns_back) {
  /* each turn allocates A, which lives until after the next turn's A (a prefetched batch),
   * and B: A's layout can only repeat every two turns (A at 0 and at 100 MiB in turn) */
  stash_loop_t L;
  _stash_loop_init(&L);
  uint64_t prev_a = STASH_LOOP_NONE;
  int hinted = 0, right = 0, forecasts = 0;
  for (int t = 0; t < 10; t++) {
    uint64_t at = (uint64_t)(t % 2) * 100 * MiB, off = 0, fc[4][2];
    size_t n = 0;
    if (_stash_loop_hint(&L, 50 * MiB, &off)) {
      hinted++;
      right += off == at; /* two turns back: the A already freed */
      /* it lived beside its turn's B (at 200 MiB), the next turn's A and B */
      forecasts += _stash_loop_forecast(&L, 50 * MiB, fc, 4, &n) && n == 3 &&
                   fc[0][0] == 200 * MiB && fc[0][1] == 8 * MiB &&
                   fc[1][0] == 100 * MiB - at && fc[1][1] == 50 * MiB && fc[2][0] == 200 * MiB;
    }
    uint64_t a = _stash_loop_alloc(&L, 50 * MiB, at);
    uint64_t b = _stash_loop_alloc(&L, 8 * MiB, 200 * MiB);
    _stash_loop_freed(&L, b, 8 * MiB);
    if (prev_a != STASH_LOOP_NONE) _stash_loop_freed(&L, prev_a, 50 * MiB);
    prev_a = a;
  }
  CHECK(hinted >= 5);
  CHECK_EQ(right, hinted);
  CHECK_EQ(forecasts, hinted);
  _stash_loop_free(&L);
}

/* Turns of a block A that lives until after the next turn's A (placed at 0 and 100 MiB in
 * turn), the first turn with two more allocations after its A (state made once, kept): the
 * number of A's hinted, and of those hinted the other place than the live A's. */
static void outliving_turns(int turns, int* first_hint, int* hinted, int* right) {
  stash_loop_t L;
  _stash_loop_init(&L);
  uint64_t prev_a = STASH_LOOP_NONE, prev_at = 0;
  *first_hint = -1;
  *hinted = *right = 0;
  for (int t = 0; t < turns; t++) {
    uint64_t off = 0, at = prev_at == 0 ? 100 * MiB : 0; /* the other place than the live A */
    if (_stash_loop_hint(&L, 50 * MiB, &off)) {
      (*hinted)++;
      *right += off == at;
      if (*first_hint < 0) *first_hint = t;
    }
    uint64_t a = _stash_loop_alloc(&L, 50 * MiB, at);
    if (t == 0)
      for (int k = 0; k < 2; k++) _stash_loop_alloc(&L, 12 * MiB, (uint64_t)(300 + 12 * k) * MiB);
    uint64_t b = _stash_loop_alloc(&L, 8 * MiB, 200 * MiB);
    _stash_loop_freed(&L, b, 8 * MiB);
    if (prev_a != STASH_LOOP_NONE) _stash_loop_freed(&L, prev_a, 50 * MiB);
    for (int k = 0; k < 4; k++) { /* temporaries: the turn's period is proposed on them */
      uint64_t c = _stash_loop_alloc(&L, (size_t)(6 + k) * MiB, 220 * MiB);
      _stash_loop_freed(&L, c, (size_t)(6 + k) * MiB);
    }
    prev_a = a;
    prev_at = at;
  }
  _stash_loop_free(&L);
}

TEST(a_block_that_outlives_its_turn_is_hinted_where_its_predecessor_was) {
  /* The first turn is longer than the others, so two turns before the second turn's A lies
   * one of its extra allocations, not the first A. The A one turn back still lives; the hint
   * is the memory of the A that one lived beside - the first A, freed since - never the live
   * one's. */
  int first_hint = 0, hinted = 0, right = 0;
  outliving_turns(8, &first_hint, &hinted, &right);
  CHECK_EQ(first_hint, 2); /* the second turn's A: the period holds from the first turn's end */
  CHECK_EQ(hinted, 6);
  CHECK_EQ(right, hinted);
}

TEST(a_live_counterparts_predecessor_is_found_after_the_history_is_cut) {
  /* 12000 turns of 12 events: the detector keeps the newer half of its history twice, and
   * each allocation's link to the previous one of its size, an event number, still leads to
   * the right one (or to none, below the history) */
  int first_hint = 0, hinted = 0, right = 0;
  outliving_turns(12000, &first_hint, &hinted, &right);
  CHECK_EQ(first_hint, 2);
  CHECK_EQ(hinted, 12000 - 2);
  CHECK_EQ(right, hinted);
}

TEST(history_is_trimmed_and_hints_stay_right) {
  stash_loop_t L;
  _stash_loop_init(&L);
  int hints = 0, wrong = 0;
  for (int t = 0; t < 12000; t++) { /* 144000 events: the history is cut twice */
    int right = turn(&L, (uint64_t)(t % 7) * 1000 * MiB, (uint64_t)((t + 6) % 7) * 1000 * MiB,
                     &hints);
    if (t > 4) wrong += hints != 6 || right != 6;
  }
  CHECK_EQ(wrong, 0);
  CHECK(L.base > 0);
  CHECK(L.n <= ((size_t)1 << 16));
  /* the records are a ring whose start is no longer its first slot: the forecast still
   * names what the counterpart (allocation 0 of the last turn) lived beside */
  CHECK(L.base % ((uint64_t)1 << 16) != 0);
  uint64_t fc[8][2];
  size_t n = 0;
  CHECK(_stash_loop_forecast(&L, kSizes[0], fc, 8, &n));
  CHECK_EQ(n, 1);
  CHECK_EQ(fc[0][0], (uint64_t)(11999 % 7) * 1000 * MiB + 32 * MiB);
  CHECK_EQ(fc[0][1], kSizes[1]);
  _stash_loop_free(&L);
}

int main(void) {
  RUN(hints_name_the_previous_turn_once_its_events_repeat);
  RUN(a_repeating_layer_that_keeps_bytes_is_not_a_turn);
  RUN(a_change_ends_the_hints_until_the_turn_repeats_again);
  RUN(allocations_placed_unknown_get_no_hint);
  RUN(a_place_outside_the_arena_is_hinted_and_not_forecast);
  RUN(a_free_of_the_same_size_a_turn_earlier_keeps_the_turn);
  RUN(the_forecast_names_what_the_counterpart_lived_beside);
  RUN(a_block_that_outlives_its_turn_is_hinted_two_turns_back);
  RUN(a_block_that_outlives_its_turn_is_hinted_where_its_predecessor_was);
  RUN(a_live_counterparts_predecessor_is_found_after_the_history_is_cut);
  RUN(history_is_trimmed_and_hints_stay_right);
  TEST_MAIN_END();
}
