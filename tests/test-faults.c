/* test-faults: every provider call failing at every step of a scripted sequence.
 *
 * For each configuration, the script is first run cleanly to count its provider calls;
 * then, for every call number k (of any kind, and of each kind separately) and for two
 * failure statuses, a fresh heap runs the script with the k-th call failing. After every
 * operation the heap must pass stash_heap_check, a failed allocation must leave the
 * allocation statistics as they were, a failed free must leave the block allocated (it is
 * freed again later). At the end everything is freed, the heap destroyed, and the
 * simulated device must hold nothing: no leak. Then the same with random failures.
 * policy:stash runs seven scripts ("policy:stash#turns", "#give_back", "#pressed", "#ranges",
 * "#tight" and "#small_new" name the last six: the heap sees the configuration before the
 * '#'), each of whose clean run reaches the branches it is there for.
 */
#include "fixture.h"

#define S1 ((void*)0x1)
#define S2 ((void*)0x2)
#define NPTR 32

typedef struct run_s {
  fixture_t f;
  void* p[NPTR];
  bool clean;   /* no fault injected: the script's paths are checked as it goes */
  int failures; /* operations that failed (any status) */
  int wrong;    /* operations that broke an invariant */
} run_t;

static void after_op(run_t* r, const char* what) {
  stash_status_t st = stash_heap_check(r->f.heap);
  if (st != STASH_OK) {
    r->wrong++;
    fprintf(stderr, "[%s] after %s: %s\n", th_current, what, stash_last_error());
  }
}

static void op_alloc(run_t* r, int slot, size_t size, void* stream) {
  stash_stats_t before = fx_stats(&r->f);
  void* p = (void*)0x1;
  stash_status_t st = stash_heap_alloc(r->f.heap, size, stream, &p);
  if (st != STASH_OK) {
    r->failures++;
    stash_stats_t after = fx_stats(&r->f);
    if (p != NULL || after.allocation[0].current != before.allocation[0].current ||
        after.allocated_bytes[0].current != before.allocated_bytes[0].current) {
      r->wrong++;
      fprintf(stderr, "[%s] failed alloc changed the allocation state\n", th_current);
    }
    if (stash_last_error()[0] == '\0') r->wrong++;
    if (getenv("FAULTS_VERBOSE")) fprintf(stderr, "  alloc slot %d (%zu): %s\n", slot, size, stash_last_error());
    p = NULL;
  }
  r->p[slot] = p;
  after_op(r, "alloc");
}

static void op_free(run_t* r, int slot) {
  if (!r->p[slot]) return;
  stash_stats_t before = fx_stats(&r->f);
  stash_status_t st = stash_heap_free(r->f.heap, r->p[slot]);
  if (st == STASH_OK) {
    r->p[slot] = NULL;
  } else {
    r->failures++;
    stash_stats_t after = fx_stats(&r->f);
    if (after.allocation[0].current != before.allocation[0].current) {
      r->wrong++;
      fprintf(stderr, "[%s] failed free changed the allocation count\n", th_current);
    }
  }
  after_op(r, "free");
}

static void op_record(run_t* r, int slot, void* stream) {
  if (!r->p[slot]) return;
  if (stash_heap_record_stream(r->f.heap, r->p[slot], stream) != STASH_OK) r->failures++;
  after_op(r, "record_stream");
}

static void op_empty(run_t* r) {
  if (stash_heap_empty_cache(r->f.heap) != STASH_OK) r->failures++;
  after_op(r, "empty_cache");
}

static int stitched_cb(const stash_segment_info_t* seg, const stash_block_info_t* b, void* arg) {
  for (size_t i = 0; i < seg->nblocks; i++) {
    if (b[i].address == *(uintptr_t*)arg) {
      *(uintptr_t*)arg = seg->mapped_size == 0; /* a stitched range has no mapped size of its own */
      return 1;
    }
  }
  return 0;
}

/* Whether p is a block of a stitched range (policy:stash). */
static bool in_stitched_range(run_t* r, void* p) {
  uintptr_t q = (uintptr_t)p;
  CHECK_OK(stash_heap_visit(r->f.heap, stitched_cb, &q));
  return q == 1;
}

static int small_lent_cb(const stash_segment_info_t* seg, const stash_block_info_t* b,
                         void* arg) {
  for (size_t i = 0; i < seg->nblocks; i++)
    if (seg->is_small && b[i].state == STASH_BLOCK_LENT) *(size_t*)arg += b[i].size;
  return 0;
}

/* Bytes of the small arena lent to stitched ranges (policy:stash). */
static size_t small_lent(run_t* r) {
  size_t n = 0;
  CHECK_OK(stash_heap_visit(r->f.heap, small_lent_cb, &n));
  return n;
}

static int unmapped_cb(const stash_segment_info_t* seg, const stash_block_info_t* b, void* arg) {
  for (size_t i = 0; i < seg->nblocks; i++)
    if (b[i].state == STASH_BLOCK_UNMAPPED) *(size_t*)arg += b[i].size;
  return 0;
}

/* Bytes of the heap's segments with no memory behind them (policy:stash: what empty_cache
 * gave back between live blocks). */
static size_t unmapped(run_t* r) {
  size_t n = 0;
  CHECK_OK(stash_heap_visit(r->f.heap, unmapped_cb, &n));
  return n;
}

/* The scripted sequence: small and large blocks on two streams, cross-stream frees, reuse,
 * an allocation that only fits after the cache is released, empty_cache with a pending
 * free, and one request that cannot fit. Capacity 200 MiB. */
static void script(run_t* r) {
  op_alloc(r, 0, 1000, S1);
  op_alloc(r, 1, 3 * MiB, S1);
  op_alloc(r, 2, 30 * MiB, S1);
  op_alloc(r, 3, 600 * KiB, S2);
  op_record(r, 1, S2);
  op_free(r, 1);
  op_alloc(r, 4, 3 * MiB, S1); /* the event is pending: not b's block */
  stash_sim_complete(r->f.sim, S2);
  op_alloc(r, 5, 2 * MiB, S1); /* processes the event */
  op_alloc(r, 6, 24 * MiB, S2);
  op_free(r, 2);
  op_free(r, 0);
  op_free(r, 6);
  op_alloc(r, 7, 130 * MiB, S1); /* fits only once the cached segments are released */
  op_free(r, 3);
  op_empty(r);
  op_alloc(r, 8, 30 * MiB, S1);
  op_record(r, 8, S2);
  op_free(r, 8);
  op_free(r, 7);
  op_empty(r);
  op_alloc(r, 9, 8 * MiB, S1);
  op_alloc(r, 10, 200 * MiB, S1); /* out of memory, after releasing the cache */
}

/* The same for policy:stash, with stitching: a large request served from a hole, the small
 * arena's free memory and new memory at a fresh address, freed and served again from the
 * same range, the same size on the other stream (whose blocks are not free for it yet: it
 * waits for their event on the device),
 * empty_cache with a pending free and blocks only a stream synchronize frees, a request that
 * fits only once the cache is released, and one that cannot fit. Capacity 1 GiB. */
static void script_stash(run_t* r) {
  op_alloc(r, 15, 1000, S1); /* a free first: the growths below are not a model's loading */
  op_free(r, 15);
  op_alloc(r, 0, 1000, S1);
  op_alloc(r, 1, 3 * MiB, S1);
  op_alloc(r, 2, 40 * MiB, S1);
  op_alloc(r, 3, 60 * MiB, S1);
  op_alloc(r, 4, 600 * KiB, S2);
  op_record(r, 1, S2);
  op_free(r, 1);
  op_alloc(r, 5, 3 * MiB, S1); /* the event is pending: not b's block */
  stash_sim_complete(r->f.sim, S2);
  op_alloc(r, 6, 2 * MiB, S1); /* processes the event */
  for (int i = 16; i < 28; i++) op_alloc(r, i, 1 * MiB, S1); /* the small arena grows twice:
                                                                by 4 MiB, then 8 (bursts) */
  for (int i = 16; i < 28; i++) op_free(r, i); /* its 2nd and 3rd allocations: wholly free */
  op_free(r, 3);
  op_free(r, 2);               /* a 100 MiB hole, a 40 MiB physical allocation wholly in it */
  op_alloc(r, 7, 300 * MiB, S1); /* stitched: those two allocations' pages and new ones */
  void* x = r->p[7];
  if (r->clean) CHECK(in_stitched_range(r, x));
  if (r->clean) CHECK_EQ(small_lent(r), 12 * MiB);
  op_free(r, 7);
  op_alloc(r, 8, 300 * MiB, S2); /* S1's pages, not free for S2 yet: S2 waits for S1's event
                                    on the device (stream_wait) */
  stash_sim_complete(r->f.sim, S1);
  op_alloc(r, 9, 300 * MiB, S1); /* the cached stitched range again */
  if (r->clean) CHECK(r->p[9] == x);
  op_free(r, 8);
  op_alloc(r, 10, 30 * MiB, S1); /* S2's freed block: S1 waits for S2's event */
  op_record(r, 10, S2);
  op_free(r, 10);
  op_empty(r); /* waits for S2's event, synchronizes S1 */
  op_free(r, 9);
  op_alloc(r, 14, 300 * MiB, S2); /* S1's pages are not S2's yet: S2 waits again */
  op_free(r, 14);
  op_alloc(r, 11, 900 * MiB, S1); /* fits only once S2's pages are released to all */
  op_free(r, 11);
  op_alloc(r, 12, 8 * MiB, S1);
  op_alloc(r, 13, 1020 * MiB, S1); /* out of memory, after releasing the cache (not more than
                                       the device: that is refused at once, cache kept) */
}

/* 21 small allocations and frees: the next growth of the large arena comes apart from the
 * last one (no burst). */
static void quiet_small(run_t* r) {
  for (int i = 0; i < 21; i++) {
    op_alloc(r, 31, 1000, S1);
    op_free(r, 31);
  }
}

/* policy:stash's two rules of the seventh session, each reached by a clean run: a request of
 * 64-128 MiB that fits nowhere, stitched from wholly free allocations with no new memory;
 * and, in a repeating turn, small requests that take the large arena's memory instead of
 * growing the small arena. Capacity 1 GiB. */
#define STITCH_COVERED (100 * MiB)
#define SMALL_IN_TURN 9 /* the small arena holds 8 MiB: the 9th would grow it */
static void script_stash_turns(run_t* r) {
  op_alloc(r, 0, 60 * MiB, S1); /* A: one allocation of 60 MiB */
  quiet_small(r);
  op_alloc(r, 1, 20 * MiB, S1); /* B: 20 MiB */
  quiet_small(r);
  op_alloc(r, 2, 40 * MiB, S1); /* C: 40 MiB, the arena's end */
  op_free(r, 0);
  op_free(r, 2);
  op_alloc(r, 3, STITCH_COVERED, S1); /* fits nowhere; A's and C's allocations cover it */
  if (r->clean) CHECK(in_stitched_range(r, r->p[3]));
  op_free(r, 3);
  for (int t = 0; t < 6; t++) { /* turns of a loop: live bytes rise to 420 MiB, fall to 20 */
    op_alloc(r, 4, 300 * MiB, S1);
    op_alloc(r, 5, 100 * MiB, S1);
    op_free(r, 4);
    op_free(r, 5);
  }
  int64_t small = r->clean ? fx_stats(&r->f).reserved_bytes[STASH_STAT_SMALL].current : 0;
  for (int i = 6; i < 6 + SMALL_IN_TURN; i++) op_alloc(r, i, 1 * MiB, S1);
  if (r->clean) CHECK_EQ(fx_stats(&r->f).reserved_bytes[STASH_STAT_SMALL].current, small);
  for (int i = 6; i < 6 + SMALL_IN_TURN; i++) op_free(r, i);
  op_empty(r);
}

/* policy:stash's empty_cache giving back a physical allocation between live blocks, and a
 * request that fits nowhere else taking it back, in place, before the arena grows. Capacity
 * 1 GiB. */
static void script_stash_give_back(run_t* r) {
  op_alloc(r, 0, 1000, S1); /* a free first: not a model being loaded */
  op_free(r, 0);
  op_alloc(r, 1, 40 * MiB, S1); /* A: an allocation of 40 MiB */
  op_alloc(r, 2, 60 * MiB, S1); /* B, in the next growth (64 MiB: a burst) */
  op_alloc(r, 3, 1000, S1);     /* a small block, so the small arena stays */
  op_free(r, 1);
  op_empty(r); /* A's allocation given back: unmapped, released */
  if (r->clean) CHECK_EQ(unmapped(r), 40 * MiB);
  op_alloc(r, 1, 40 * MiB, S1); /* the free end holds 4 MiB: A's allocation made again */
  if (r->clean) CHECK_EQ(unmapped(r), 0);
  op_free(r, 1);
  op_empty(r);
  op_alloc(r, 4, 950 * MiB, S1); /* the device holds 1 GiB: only with A's memory given back */
  op_free(r, 4);
  op_free(r, 2);
  op_empty(r);
}

/* policy:stash with max_piece_size_mb:20 on a full device: growths in 20 MiB pieces, and a
 * request the rules would grow the arena for, which the device cannot hold, stitched
 * "pressed" from a hole's whole allocations, a head and new memory; then served again from
 * its cached range, and empty_cache. Capacity 1 GiB. */
static void script_stash_pressed(run_t* r) {
  op_alloc(r, 15, 1000, S1); /* a free first: not a model being loaded */
  op_free(r, 15);
  op_alloc(r, 0, 1000, S1); /* the small arena stays */
  quiet_small(r);
  op_alloc(r, 1, 64 * MiB, S1); /* A: 20 + 20 + 20 + 4 MiB */
  quiet_small(r);
  op_alloc(r, 2, 100 * MiB, S1); /* B: 5 x 20 MiB */
  if (r->clean) CHECK_EQ(fx_stats(&r->f).segment[STASH_STAT_LARGE].current, 9);
  op_free(r, 1);
  op_alloc(r, 3, 10 * MiB, S1); /* A's front: 44 MiB of whole allocations behind it, a head */
  op_alloc(r, 4, 900 * MiB, S1); /* 858 MiB left on the device: stitched, pressed */
  if (r->clean) CHECK(in_stitched_range(r, r->p[4]));
  void* x = r->p[4];
  op_free(r, 4);
  op_alloc(r, 5, 900 * MiB, S1); /* the cached range again */
  if (r->clean) CHECK(r->p[5] == x);
  op_free(r, 5);
  op_empty(r);
  op_free(r, 3);
  op_free(r, 2);
  op_empty(r);
}

/* policy:stash's turn replay of a stitched block: turns of 40, 150 and 60 MiB, each freed
 * three allocations later; from the sixth turn the 150 MiB block is stitched in its
 * counterpart's range, two turns back (test-stash's
 * turn_replay_gives_a_stitched_block_its_counterparts_range). Capacity 1 GiB. */
static void script_stash_ranges(run_t* r) {
  static const size_t mib[3] = {40, 150, 60};
  uintptr_t at[8] = {0};
  for (int n = 0; n < 8 * 3; n++) {
    int slot = n % 4;
    op_alloc(r, slot, mib[n % 3] * MiB, S1);
    if (n % 3 == 1) at[n / 3] = (uintptr_t)r->p[slot];
    if (r->clean && n % 3 == 1 && n / 3 >= 5) {
      CHECK(in_stitched_range(r, r->p[slot]));
      CHECK_EQ(at[n / 3], at[n / 3 - 2]);
    }
    if (n >= 3) op_free(r, (n - 3) % 4);
  }
  for (int slot = 0; slot < 4; slot++) op_free(r, slot);
  op_empty(r);
}

/* policy:stash turning tight: 930 MiB of the 1 GiB device held when live bytes first fall to
 * half their peak; the allocation that sees the drop gives back what lies wholly free (between
 * live blocks too) in free blocks that cannot hold the largest request so far (200 MiB, still
 * live: three 180 MiB holes) and later growth comes in 20 MiB pieces (test-stash's
 * a_device_nearly_full_at_the_first_drop_turns_tight). Capacity 1 GiB. */
static void script_stash_tight(run_t* r) {
  op_alloc(r, 0, 1000, S1);
  op_free(r, 0);
  quiet_small(r);
  op_alloc(r, 0, 200 * MiB, S1);
  for (int i = 1; i <= 11; i++) {
    quiet_small(r); /* growths apart: each its own allocation */
    op_alloc(r, i, 60 * MiB, S1);
  }
  op_alloc(r, 12, 70 * MiB, S1);
  int64_t reserved = r->clean ? fx_stats(&r->f).reserved_bytes[STASH_STAT_LARGE].current : 0;
  for (int i = 1; i <= 11; i++)
    if (i != 4 && i != 8) op_free(r, i);
  op_alloc(r, 13, 2 * MiB, S1); /* the first drop: what lies wholly free goes back */
  if (r->clean)
    CHECK(fx_stats(&r->f).reserved_bytes[STASH_STAT_LARGE].current <= reserved - 500 * (int64_t)MiB);
  op_alloc(r, 14, 150 * MiB, S1); /* 8 pieces at the arena's end */
  op_free(r, 14);
  op_empty(r);
  op_alloc(r, 15, 400 * MiB, S1); /* after empty_cache, still in pieces */
  for (int i = 0; i < 16; i++) op_free(r, i);
  op_empty(r);
}

/* policy:stash's stitched range whose new memory, under 6 MiB, is mapped in the arena at once:
 * [A 100 MiB][B 30][C 100][D 20, taken whole], A and C freed, a 204 MiB request stitched
 * from them and 4 MiB new (a map and an access call in the arena at once), freed, then A,
 * C and the 4 MiB taken in the arena (test-stash's
 * small_stitch_memory_is_mapped_in_the_arena_at_once). Capacity 1 GiB. */
static void script_stash_small_new(run_t* r) {
  static const size_t mib[4] = {100, 30, 100, 20};
  op_alloc(r, 0, 1000, S1);
  op_free(r, 0); /* a free first: the growths below are not a model's loading */
  for (int i = 0; i < 4; i++) {
    quiet_small(r);
    op_alloc(r, i, mib[i] * MiB, S1);
  }
  op_free(r, 0);
  op_free(r, 2);
  uint64_t access = stash_sim_calls(r->f.sim, STASH_CALL_set_access);
  op_alloc(r, 4, 204 * MiB, S1);
  if (r->clean) {
    CHECK(in_stitched_range(r, r->p[4]));
    CHECK_EQ(stash_sim_calls(r->f.sim, STASH_CALL_set_access) - access, 2);
  }
  op_free(r, 4);
  op_alloc(r, 0, 100 * MiB, S1);
  op_alloc(r, 2, 100 * MiB, S1);
  op_alloc(r, 5, 4 * MiB, S1); /* on the new memory, mapped there already */
  for (int i = 0; i < 6; i++) op_free(r, i);
  op_empty(r);
}

static bool run_script(const char* conf, stash_provider_call_t call, uint64_t nth,
                       stash_status_t status, double p, uint64_t seed, uint64_t* calls_out) {
  run_t r;
  memset(&r, 0, sizeof r);
  bool turns = strstr(conf, "#turns") != NULL; /* the second policy:stash script */
  bool give_back = strstr(conf, "#give_back") != NULL; /* the third */
  bool pressed = strstr(conf, "#pressed") != NULL;     /* the fourth */
  bool ranges = strstr(conf, "#ranges") != NULL;       /* the fifth */
  bool tight = strstr(conf, "#tight") != NULL;         /* the sixth */
  bool small_new = strstr(conf, "#small_new") != NULL; /* the seventh */
  bool stash = strstr(conf, "policy:stash") != NULL;
  char heap_conf[64];
  snprintf(heap_conf, sizeof heap_conf, "%.*s", (int)strcspn(conf, "#"), conf);
  if (!fx_open(&r.f, heap_conf, stash ? 1024 * MiB : 200 * MiB)) return false;
  stash_sim_reset_calls(r.f.sim);
  r.clean = !nth && p == 0;
  if (nth) stash_sim_fail_nth(r.f.sim, call, nth, status);
  if (p > 0) stash_sim_fail_random(r.f.sim, STASH_CALL_ANY, p, seed, status);
  if (small_new) script_stash_small_new(&r);
  else if (tight) script_stash_tight(&r);
  else if (ranges) script_stash_ranges(&r);
  else if (pressed) script_stash_pressed(&r);
  else if (give_back) script_stash_give_back(&r);
  else if (turns) script_stash_turns(&r);
  else if (stash) script_stash(&r);
  else script(&r);
  if (calls_out) *calls_out = stash_sim_calls(r.f.sim, call);
  if ((turns || give_back || pressed || ranges || tight || small_new) && !nth && p == 0)
    CHECK_EQ(r.failures, 0);
  if (!turns && !give_back && !pressed && !ranges && !tight && !small_new && !nth && p == 0 &&
      call == STASH_CALL_ANY) {
    /* The clean run must reach every path the faults are meant to hit. */
    bool vmm = stash || strstr(conf, "expandable") != NULL;
    stash_provider_call_t need_plain[] = {STASH_CALL_mem_alloc, STASH_CALL_mem_free};
    stash_provider_call_t need_vmm[] = {STASH_CALL_va_reserve,
                                        STASH_CALL_phys_create, STASH_CALL_phys_release,
                                        STASH_CALL_map, STASH_CALL_unmap,
                                        STASH_CALL_set_access, STASH_CALL_stream_synchronize};
    stash_provider_call_t need_all[] = {STASH_CALL_event_create, STASH_CALL_event_record,
                                        STASH_CALL_event_query, STASH_CALL_event_synchronize,
                                        STASH_CALL_mem_info};
    for (size_t i = 0; i < sizeof need_all / sizeof need_all[0]; i++)
      CHECK(stash_sim_calls(r.f.sim, need_all[i]) > 0);
    /* policy:stash's stream waits (policy:pytorch never makes one) */
    CHECK_EQ(stash_sim_calls(r.f.sim, STASH_CALL_stream_wait) > 0, stash);
    if (vmm) {
      for (size_t i = 0; i < sizeof need_vmm / sizeof need_vmm[0]; i++)
        CHECK(stash_sim_calls(r.f.sim, need_vmm[i]) > 0);
      /* policy:pytorch frees address ranges with their segments; policy:stash keeps its
       * ranges for the heap's life */
      CHECK_EQ(stash_sim_calls(r.f.sim, STASH_CALL_va_free) > 0, !stash);
    } else {
      for (size_t i = 0; i < sizeof need_plain / sizeof need_plain[0]; i++)
        CHECK(stash_sim_calls(r.f.sim, need_plain[i]) > 0);
    }
    stash_stats_t s = fx_stats(&r.f);
    CHECK_EQ(s.num_ooms, 1);
    CHECK(s.num_alloc_retries >= 2);
    CHECK_EQ(r.failures, 1); /* only the 200 MiB request */
  }
  uint64_t injected = stash_sim_injected(r.f.sim);
  /* Turn faults off, then everything must come back. */
  stash_sim_fail_nth(r.f.sim, STASH_CALL_ANY, 0, STASH_OK);
  for (int k = 0; k < STASH_CALL_COUNT; k++) stash_sim_fail_nth(r.f.sim, k, 0, STASH_OK);
  stash_sim_fail_random(r.f.sim, STASH_CALL_ANY, 0, 0, STASH_OK);
  stash_sim_complete(r.f.sim, S1);
  stash_sim_complete(r.f.sim, S2);
  for (int i = 0; i < NPTR; i++) {
    if (r.p[i]) {
      stash_status_t st = stash_heap_free(r.f.heap, r.p[i]);
      if (st != STASH_OK) {
        r.wrong++;
        fprintf(stderr, "[%s] freeing slot %d after the faults: %s\n", th_current, i,
                stash_last_error());
      }
    }
  }
  if (nth && injected == 0 && r.failures) {
    r.wrong++; /* nothing was injected, so nothing may fail */
    fprintf(stderr, "[%s] a call failed with no fault injected\n", th_current);
  }
  int before = th_failures;
  fx_close(&r.f); /* checks: heap consistent, destroy OK, nothing left on the device */
  if (r.wrong || th_failures != before) {
    fprintf(stderr, "  ... conf '%s', %s call %llu failing with %s (p=%g seed=%llu)\n", conf,
            stash_provider_call_name(call), (unsigned long long)nth, stash_status_name(status),
            p, (unsigned long long)seed);
    th_failures += r.wrong;
    return false;
  }
  return true;
}

static const char* const k_confs[] = {
    "policy:stash",
    "policy:stash#turns", /* script_stash_turns (the heap sees "policy:stash") */
    "policy:stash#give_back", /* script_stash_give_back */
    "policy:stash,max_piece_size_mb:20#pressed", /* script_stash_pressed */
    "policy:stash#ranges", /* script_stash_ranges */
    "policy:stash#tight", /* script_stash_tight */
    "policy:stash#small_new", /* script_stash_small_new */
    "policy:pytorch",
    "policy:pytorch,expandable_segments:True",
    "policy:pytorch,max_split_size_mb:20",
};

TEST(clean_script_leaves_nothing) {
  for (size_t c = 0; c < sizeof k_confs / sizeof k_confs[0]; c++) {
    uint64_t calls = 0;
    CHECK(run_script(k_confs[c], STASH_CALL_ANY, 0, STASH_OK, 0, 0, &calls));
  }
}

TEST(every_call_fails_once) {
  static const stash_status_t statuses[] = {STASH_ERR_OOM, STASH_ERR_DRIVER};
  int runs = 0;
  for (size_t c = 0; c < sizeof k_confs / sizeof k_confs[0]; c++) {
    for (int kind = 0; kind <= STASH_CALL_COUNT; kind++) {
      uint64_t total = 0;
      run_script(k_confs[c], (stash_provider_call_t)kind, 0, STASH_OK, 0, 0, &total);
      for (uint64_t k = 1; k <= total; k++) {
        for (size_t s = 0; s < 2; s++) {
          if (!run_script(k_confs[c], (stash_provider_call_t)kind, k, statuses[s], 0, 0, NULL))
            return; /* one report is enough */
          runs++;
        }
      }
    }
  }
  fprintf(stderr, "every_call_fails_once: %d runs\n", runs);
  CHECK(runs > 600);
}

TEST(random_failures) {
  for (size_t c = 0; c < sizeof k_confs / sizeof k_confs[0]; c++) {
    for (uint64_t seed = 1; seed <= 200; seed++) {
      if (!run_script(k_confs[c], STASH_CALL_ANY, 0, seed % 2 ? STASH_ERR_DRIVER : STASH_ERR_OOM,
                      0.08, seed, NULL))
        return;
    }
  }
}

TEST(heap_creation_fails_cleanly) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  stash_sim_fail_nth(sim, STASH_CALL_mem_info, 1, STASH_ERR_DRIVER);
  stash_heap_t* h = (stash_heap_t*)0x1;
  CHECK_EQ(stash_heap_create(NULL, stash_sim_provider(sim), 0, &h), STASH_ERR_DRIVER);
  CHECK(h == NULL);
  CHECK_STR_CONTAINS(stash_last_error(), "injected failure of mem_info");
  CHECK_OK(stash_heap_create(NULL, stash_sim_provider(sim), 0, &h));
  CHECK_OK(stash_heap_destroy(h));
  stash_sim_destroy(sim);
}

TEST(driver_errors_carry_the_provider_message) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  stash_sim_fail_nth(f.sim, STASH_CALL_mem_alloc, 1, STASH_ERR_DRIVER);
  void* p;
  CHECK_EQ(stash_heap_alloc(f.heap, 1000, NULL, &p), STASH_ERR_DRIVER);
  CHECK_STR_CONTAINS(stash_last_error(), "provider 'sim' failed to allocate a segment");
  CHECK_STR_CONTAINS(stash_last_error(), "injected failure of mem_alloc");
  /* A driver error is not out of memory: no cache release, no retry. */
  CHECK_EQ(fx_stats(&f).num_alloc_retries, 0);
  CHECK_EQ(fx_stats(&f).num_ooms, 0);
  fx_close(&f);
}

int main(void) {
  RUN(clean_script_leaves_nothing);
  RUN(every_call_fails_once);
  RUN(random_failures);
  RUN(heap_creation_fails_cleanly);
  RUN(driver_errors_carry_the_provider_message);
  TEST_MAIN_END();
}
