/* test-sim: the simulated provider - legality checks, events, fault injection, and the
 * driver-like placement of plain allocations against addresses measured on the H200, and
 * placement at a traced program's own addresses (stash_sim_place_at). */
#include <math.h>

#include "fixture.h"
#include "internal.h"

#define CHECK_NEAR(a, b) CHECK(fabs((double)(a) - (double)(b)) < 1e-6)

/* cuMemAlloc on an H200 (driver 580.159), fresh process: size and address relative to the
 * first allocation (tools/gpu/va_probe.c < tools/gpu/probe_mixed.txt). */
static const struct {
  size_t size;
  long long offset;
} k_mixed[] = {
    {2097152, 0x0LL},
    {20971520, 0x4a00000LL},
    {2097152, 0x5e00000LL},
    {2097152, 0x6000000LL},
    {104857600, -0x21e00000LL},
    {2097152, -0x1ba00000LL},
    {20971520, -0x1b800000LL},
    {205520896, -0x2fe00000LL},
    {52428800, -0x33e00000LL},
    {2097152, -0x30c00000LL},
    {77594624, -0x39e00000LL},
    {39845888, -0x3de00000LL},
    {205520896, -0x4be00000LL},
    {310378496, -0x5fe00000LL},
    {2097152, -0x4d600000LL},
    {14680064, -0x4d400000LL},
    {27262976, -0x3fa00000LL},
    {102760448, -0x67e00000LL},
    {134217728, -0x6fe00000LL},
    {2097152, -0x61c00000LL},
    {314572800, -0x83e00000LL},
    {2097152, -0x71200000LL},
    {2097152, -0x71000000LL}};

/* 40 allocations of 2 MiB (probe_p2m.txt). */
static const long long k_p2m[] = {0x0LL, 0x4a00000LL, 0x4c00000LL, 0x4e00000LL, 0x5000000LL, 0x5200000LL, 0x5400000LL, 0x5600000LL, 0x5800000LL, 0x5a00000LL, 0x5c00000LL, 0x5e00000LL, 0x6000000LL, -0x1be00000LL, -0x1bc00000LL, -0x1ba00000LL, -0x1b800000LL, -0x1b600000LL, -0x1b400000LL, -0x1b200000LL, -0x1b000000LL, -0x1ae00000LL, -0x1ac00000LL, -0x1aa00000LL, -0x1a800000LL, -0x1a600000LL, -0x1a400000LL, -0x1a200000LL, -0x1a000000LL, -0x1de00000LL, -0x1dc00000LL, -0x1da00000LL, -0x1d800000LL, -0x1d600000LL, -0x1d400000LL, -0x1d200000LL, -0x1d000000LL, -0x1ce00000LL, -0x1cc00000LL, -0x1ca00000LL};

TEST(placement_matches_the_driver) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  uint64_t first = 0;
  for (size_t i = 0; i < sizeof k_mixed / sizeof k_mixed[0]; i++) {
    uint64_t a = 0;
    CHECK_OK(p->mem_alloc(p->ctx, 0, k_mixed[i].size, &a));
    if (i == 0) first = a;
    CHECK_EQ((long long)(a - first), k_mixed[i].offset);
  }
  stash_sim_destroy(sim);
  CHECK_OK(stash_sim_create(1, 0, &sim));
  p = stash_sim_provider(sim);
  for (size_t i = 0; i < sizeof k_p2m / sizeof k_p2m[0]; i++) {
    uint64_t a = 0;
    CHECK_OK(p->mem_alloc(p->ctx, 0, 2 * MiB, &a));
    if (i == 0) first = a;
    CHECK_EQ((long long)(a - first), k_p2m[i]);
  }
  stash_sim_destroy(sim);
}

TEST(freed_ranges_are_reused_lowest_first) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  uint64_t a, b, c, d;
  CHECK_OK(p->mem_alloc(p->ctx, 0, 100 * MiB, &a)); /* a 128 MiB chunk */
  CHECK_OK(p->mem_alloc(p->ctx, 0, 20 * MiB, &b));  /* lowest fit: a's chunk, not start-up */
  CHECK_EQ(b, a + 100 * MiB);
  CHECK_OK(p->mem_alloc(p->ctx, 0, 4 * MiB, &c));
  CHECK_EQ(c, a + 120 * MiB);
  CHECK_OK(p->mem_free(p->ctx, 0, c, 4 * MiB));
  CHECK_OK(p->mem_alloc(p->ctx, 0, 2 * MiB, &d));
  CHECK_EQ(d, c);
  CHECK_OK(p->mem_free(p->ctx, 0, d, 2 * MiB));
  CHECK_OK(p->mem_free(p->ctx, 0, a, 100 * MiB));
  CHECK_OK(p->mem_free(p->ctx, 0, b, 20 * MiB));
  stash_sim_usage_t u;
  stash_sim_usage(sim, 0, &u);
  CHECK_EQ(u.used_bytes, 0);
  CHECK_EQ(u.allocations, 0);
  stash_sim_destroy(sim);
}

TEST(placement_at_traced_addresses) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  uint64_t a, b, c, d, e, f;
  CHECK_OK(p->mem_alloc(p->ctx, 0, 2 * MiB, &a)); /* the start-up 2 MiB range */
  stash_sim_place_at(sim, a + 290 * MiB);         /* free: taken there, above everything */
  CHECK_OK(p->mem_alloc(p->ctx, 0, 20 * MiB, &b));
  CHECK_EQ(b, a + 290 * MiB);
  stash_sim_place_at(sim, a);                      /* in use: placed as the driver would */
  CHECK_OK(p->mem_alloc(p->ctx, 0, 20 * MiB, &c));
  CHECK_EQ(c, a + 74 * MiB);
  stash_sim_place_at(sim, a + 300 * MiB + 4096);   /* not page-aligned: likewise */
  CHECK_OK(p->mem_alloc(p->ctx, 0, 2 * MiB, &d));
  CHECK_EQ(d, a + 94 * MiB);
  /* A hinted range where the next chunk would go: that chunk goes below it. */
  uint64_t top = a - 0x19e00000ULL;
  stash_sim_place_at(sim, top - 32 * MiB);
  CHECK_OK(p->mem_alloc(p->ctx, 0, 20 * MiB, &e));
  CHECK_EQ(e, top - 32 * MiB);
  stash_sim_place_at(sim, 0);
  CHECK_OK(p->mem_alloc(p->ctx, 0, 30 * MiB, &f));
  CHECK_EQ(f, top - 64 * MiB);
  /* A freed hinted range is released and can be hinted again. */
  CHECK_OK(p->mem_free(p->ctx, 0, b, 20 * MiB));
  stash_sim_place_at(sim, b);
  CHECK_OK(p->mem_alloc(p->ctx, 0, 20 * MiB, &b));
  CHECK_EQ(b, a + 290 * MiB);
  stash_sim_place_at(sim, 0);
  uint64_t all[][2] = {{a, 2 * MiB}, {b, 20 * MiB}, {c, 20 * MiB}, {d, 2 * MiB},
                       {e, 20 * MiB}, {f, 30 * MiB}};
  for (size_t i = 0; i < 6; i++) CHECK_OK(p->mem_free(p->ctx, 0, all[i][0], all[i][1]));
  stash_sim_usage_t u;
  stash_sim_usage(sim, 0, &u);
  CHECK_EQ(u.used_bytes, 0);
  CHECK_EQ(u.allocations, 0);
  stash_sim_destroy(sim);
}

TEST(illegal_calls_are_errors) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 64 * MiB, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  void* x = p->ctx;
  uint64_t a, va, h, h2, ev, ev2;
  CHECK_EQ(p->mem_alloc(x, 0, 0, &a), STASH_ERR_INVALID);
  CHECK_EQ(p->mem_alloc(x, 1, 2 * MiB, &a), STASH_ERR_INVALID); /* no device 1 */
  CHECK_EQ(p->mem_alloc(x, 0, 65 * MiB, &a), STASH_ERR_OOM);
  CHECK_OK(p->mem_alloc(x, 0, 3 * MiB, &a));
  CHECK_EQ(p->mem_free(x, 0, a, 2 * MiB), STASH_ERR_DRIVER); /* wrong size */
  CHECK_EQ(p->mem_free(x, 0, a + 512, 3 * MiB), STASH_ERR_DRIVER);
  size_t fr, tot;
  CHECK_OK(p->mem_info(x, 0, &fr, &tot));
  CHECK_EQ(tot, 64 * MiB);
  CHECK_EQ(fr, 60 * MiB); /* 3 MiB takes two 2 MiB pages */
  CHECK_OK(p->mem_free(x, 0, a, 3 * MiB));
  CHECK_EQ(p->mem_free(x, 0, a, 3 * MiB), STASH_ERR_DRIVER); /* double free */
  CHECK_OK(p->va_reserve(x, 0, 8 * MiB, &va));
  CHECK_EQ(p->va_reserve(x, 0, 3 * MiB, &va + 0), STASH_ERR_INVALID);
  CHECK_OK(p->phys_create(x, 0, 2 * MiB, &h));
  CHECK_EQ(p->map(x, 0, va - 2 * MiB, 2 * MiB, h, 0), STASH_ERR_DRIVER); /* outside */
  CHECK_EQ(p->set_access(x, 0, va, 2 * MiB), STASH_ERR_DRIVER);       /* not mapped */
  CHECK_OK(p->map(x, 0, va, 2 * MiB, h, 0));
  CHECK(!stash_sim_is_usable(sim, 0, va, 512));
  CHECK_OK(p->set_access(x, 0, va, 2 * MiB));
  CHECK(stash_sim_is_usable(sim, 0, va, 2 * MiB));
  CHECK(!stash_sim_is_usable(sim, 0, va, 2 * MiB + 1));
  CHECK_OK(p->phys_create(x, 0, 2 * MiB, &h2));
  CHECK_EQ(p->map(x, 0, va, 2 * MiB, h2, 0), STASH_ERR_DRIVER); /* already mapped */
  CHECK_EQ(p->va_free(x, 0, va, 8 * MiB), STASH_ERR_DRIVER); /* pages still mapped */
  CHECK_OK(p->unmap(x, 0, va, 2 * MiB));
  CHECK_EQ(p->unmap(x, 0, va, 2 * MiB), STASH_ERR_DRIVER);
  CHECK_OK(p->phys_release(x, 0, h));
  CHECK_OK(p->phys_release(x, 0, h2));
  CHECK_EQ(p->phys_release(x, 0, h2), STASH_ERR_DRIVER);
  CHECK_OK(p->va_free(x, 0, va, 8 * MiB));
  /* events complete when their stream's work does */
  CHECK_OK(p->event_create(x, 0, &ev));
  CHECK_OK(p->event_query(x, ev)); /* never recorded: complete */
  CHECK_OK(p->event_create(x, 0, &ev2));
  CHECK_OK(p->event_record(x, 0, ev, (void*)7));
  CHECK_EQ(p->event_query(x, ev), STASH_ERR_NOT_READY);
  stash_sim_complete(sim, (void*)7);
  CHECK_OK(p->event_query(x, ev));
  CHECK_OK(p->event_record(x, 0, ev, (void*)7));
  CHECK_OK(p->event_record(x, 0, ev2, (void*)8));
  CHECK_EQ(p->event_query(x, ev), STASH_ERR_NOT_READY);
  stash_sim_complete(sim, (void*)9); /* another stream's work: not theirs */
  CHECK_EQ(p->event_query(x, ev), STASH_ERR_NOT_READY);
  stash_sim_complete_all(sim); /* every stream's */
  CHECK_OK(p->event_query(x, ev));
  CHECK_OK(p->event_query(x, ev2));
  CHECK_OK(p->event_destroy(x, ev2));
  CHECK_OK(p->event_record(x, 0, ev, (void*)7));
  CHECK_OK(p->event_synchronize(x, ev)); /* waiting completes it */
  CHECK_OK(p->event_query(x, ev));
  CHECK_OK(p->event_destroy(x, ev));
  CHECK_EQ(p->event_query(x, ev), STASH_ERR_DRIVER);
  stash_sim_usage_t u;
  stash_sim_usage(sim, 0, &u);
  CHECK_EQ(u.used_bytes + u.allocations + u.reservations + u.handles + u.mapped_pages + u.events, 0);
  stash_sim_destroy(sim);
}

/* stream_wait: the waiting stream's later work completes only after the event waited for, so
 * completing it (stash_sim_complete, event_synchronize, stream_synchronize) completes that
 * event's stream up to the event too - and what that stream waited for in turn - but not the
 * other stream's later work, nor the waiting stream's work queued before the wait. */
TEST(a_stream_wait_orders_the_waiting_streams_later_work_after_the_event) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 64 * MiB, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  void* x = p->ctx;
  void *A = (void*)7, *B = (void*)8, *C = (void*)9;
  uint64_t a1, a2, b0, b1, c1;
  CHECK_OK(p->event_create(x, 0, &a1));
  CHECK_OK(p->event_create(x, 0, &a2));
  CHECK_OK(p->event_create(x, 0, &b0));
  CHECK_OK(p->event_create(x, 0, &b1));
  CHECK_OK(p->event_create(x, 0, &c1));
  CHECK_OK(p->event_record(x, 0, b0, B)); /* B's work before the wait */
  CHECK_OK(p->event_record(x, 0, a1, A));
  CHECK_OK(p->stream_wait(x, 0, B, a1));
  CHECK_OK(p->event_record(x, 0, a2, A)); /* A's work after the event B waits for */
  CHECK_OK(p->event_record(x, 0, b1, B));
  CHECK_EQ(p->event_query(x, b1), STASH_ERR_NOT_READY);
  stash_sim_complete(sim, A); /* A's work: B's after the wait is still queued */
  CHECK_OK(p->event_query(x, a1));
  CHECK_EQ(p->event_query(x, b1), STASH_ERR_NOT_READY);
  /* again, completed from B's side: B's work is done, so A's up to a1 is, not a2 */
  CHECK_OK(p->event_record(x, 0, a1, A));
  CHECK_OK(p->stream_wait(x, 0, B, a1));
  CHECK_OK(p->event_record(x, 0, a2, A));
  CHECK_OK(p->event_record(x, 0, b1, B));
  stash_sim_complete(sim, B);
  CHECK_OK(p->event_query(x, b1));
  CHECK_OK(p->event_query(x, a1));
  CHECK_EQ(p->event_query(x, a2), STASH_ERR_NOT_READY);
  /* waiting for B's event before the wait completes nothing of A's; after it, a1 and what
   * a1's stream waited for (C's c1): a chain */
  CHECK_OK(p->event_record(x, 0, c1, C));
  CHECK_OK(p->stream_wait(x, 0, A, c1));
  CHECK_OK(p->event_record(x, 0, a1, A));
  CHECK_OK(p->event_record(x, 0, b0, B));
  CHECK_OK(p->stream_wait(x, 0, B, a1));
  CHECK_OK(p->event_record(x, 0, b1, B));
  CHECK_OK(p->event_synchronize(x, b0));
  CHECK_EQ(p->event_query(x, a1), STASH_ERR_NOT_READY);
  CHECK_OK(p->event_synchronize(x, b1));
  CHECK_OK(p->event_query(x, a1));
  CHECK_OK(p->event_query(x, c1));
  /* a cycle of waits ends; a stream's synchronize completes what it waited for */
  CHECK_OK(p->event_record(x, 0, a1, A));
  CHECK_OK(p->event_record(x, 0, b1, B));
  CHECK_OK(p->stream_wait(x, 0, A, b1));
  CHECK_OK(p->stream_wait(x, 0, B, a1));
  CHECK_OK(p->stream_synchronize(x, 0, A));
  CHECK_OK(p->event_query(x, a1));
  CHECK_OK(p->event_query(x, b1));
  /* a completed or never recorded event, or one of the stream's own: nothing to wait for */
  CHECK_OK(p->stream_wait(x, 0, B, a1));
  CHECK_OK(p->event_record(x, 0, b1, B));
  stash_sim_complete(sim, B);
  CHECK_OK(p->event_query(x, b1));
  CHECK_EQ(p->stream_wait(x, 0, B, 999), STASH_ERR_DRIVER); /* no such event */
  CHECK_EQ(stash_sim_calls(sim, STASH_CALL_stream_wait), 8); /* the refused one counted */
  uint64_t all[] = {a1, a2, b0, b1, c1};
  for (int k = 0; k < 5; k++) CHECK_OK(p->event_destroy(x, all[k]));
  stash_sim_destroy(sim);
}

/* stash_sim_stream_point / stash_sim_ordered_after: B's later work follows A's work up to a
 * point once that work has completed or B waits for an event A recorded after it. */
TEST(ordered_after_follows_completion_and_waits) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 64 * MiB, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  void* x = p->ctx;
  void *A = (void*)7, *B = (void*)8;
  uint64_t e1, e2;
  CHECK_OK(p->event_create(x, 0, &e1));
  CHECK_OK(p->event_create(x, 0, &e2));
  CHECK_OK(p->event_record(x, 0, e1, A));
  uint64_t pt = stash_sim_stream_point(sim, A); /* after e1 */
  CHECK(stash_sim_ordered_after(sim, A, pt, A));  /* a stream's own work: in order */
  CHECK(!stash_sim_ordered_after(sim, A, pt, B));
  CHECK_OK(p->stream_wait(x, 0, B, e1)); /* e1 was recorded before the point */
  CHECK(!stash_sim_ordered_after(sim, A, pt, B));
  CHECK_OK(p->event_record(x, 0, e2, A));
  CHECK_OK(p->stream_wait(x, 0, B, e2)); /* e2 after it */
  CHECK(stash_sim_ordered_after(sim, A, pt, B));
  CHECK(!stash_sim_ordered_after(sim, A, stash_sim_stream_point(sim, A), B));
  stash_sim_complete(sim, A); /* everything A queued: every point so far */
  CHECK(stash_sim_ordered_after(sim, A, stash_sim_stream_point(sim, A), B));
  CHECK_OK(p->event_record(x, 0, e1, A));
  pt = stash_sim_stream_point(sim, A);
  CHECK(!stash_sim_ordered_after(sim, A, pt, B));
  CHECK_OK(p->event_synchronize(x, e1)); /* up to e1, recorded before the point: not enough */
  CHECK(!stash_sim_ordered_after(sim, A, pt, B));
  CHECK_OK(p->stream_synchronize(x, 0, A));
  CHECK(stash_sim_ordered_after(sim, A, pt, B));
  CHECK_OK(p->event_destroy(x, e1));
  CHECK_OK(p->event_destroy(x, e2));
  stash_sim_destroy(sim);
}

/* Waits chain: C waits for an event B recorded after B waited for one A recorded, so C's
 * later work runs after A's work up to A's event - not after A's later work, nor does a wait
 * B made after its event count. (fuzz_ops found the check taking only C's own waits.) */
TEST(ordered_after_follows_a_chain_of_waits) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 64 * MiB, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  void* x = p->ctx;
  void *A = (void*)7, *B = (void*)8, *C = (void*)9;
  uint64_t ea, eb, ea2;
  CHECK_OK(p->event_create(x, 0, &ea));
  CHECK_OK(p->event_create(x, 0, &eb));
  CHECK_OK(p->event_create(x, 0, &ea2));
  uint64_t pt = stash_sim_stream_point(sim, A); /* A's work so far */
  CHECK_OK(p->event_record(x, 0, ea, A));
  CHECK_OK(p->stream_wait(x, 0, B, ea));
  CHECK_OK(p->event_record(x, 0, eb, B));
  CHECK(!stash_sim_ordered_after(sim, A, pt, C));
  CHECK_OK(p->stream_wait(x, 0, C, eb));
  CHECK(stash_sim_ordered_after(sim, A, pt, C)); /* C -> B -> A */
  uint64_t pt2 = stash_sim_stream_point(sim, A); /* A's work up to ea and after it */
  CHECK(!stash_sim_ordered_after(sim, A, pt2, C));
  /* A's later work, waited for by B after eb: B's, not C's */
  CHECK_OK(p->event_record(x, 0, ea2, A));
  CHECK_OK(p->stream_wait(x, 0, B, ea2));
  CHECK(stash_sim_ordered_after(sim, A, pt2, B));
  CHECK(!stash_sim_ordered_after(sim, A, pt2, C));
  stash_sim_complete(sim, B); /* B's work done: the work it waited for too */
  CHECK(stash_sim_ordered_after(sim, A, pt2, C));
  CHECK_OK(p->event_destroy(x, ea));
  CHECK_OK(p->event_destroy(x, eb));
  CHECK_OK(p->event_destroy(x, ea2));
  stash_sim_destroy(sim);
}

/* stash_sim_complete_to: a GPU behind the host (stash-replay --lag). The work queued on a
 * stream up to a point completes - its events recorded before then, and the work of other
 * streams it waited for before then - and what was queued since stays pending (from the
 * stream's next event on: the simulation tells work apart by events). */
TEST(complete_to_an_earlier_point_leaves_the_later_work_pending) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 64 * MiB, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  void* x = p->ctx;
  void *A = (void*)7, *B = (void*)8;
  uint64_t e1, e2, eb, eb2;
  CHECK_OK(p->event_create(x, 0, &e1));
  CHECK_OK(p->event_create(x, 0, &e2));
  CHECK_OK(p->event_create(x, 0, &eb));
  CHECK_OK(p->event_create(x, 0, &eb2));
  CHECK_OK(p->event_record(x, 0, eb, B));
  CHECK_OK(p->stream_wait(x, 0, A, eb)); /* A's work from here on waits for B's up to eb */
  CHECK_OK(p->event_record(x, 0, e1, A));
  uint64_t then = stash_sim_stream_point(sim, A);
  CHECK_OK(p->event_record(x, 0, e2, A));
  CHECK_OK(p->event_record(x, 0, eb2, B));
  CHECK_OK(p->stream_wait(x, 0, A, eb2)); /* queued after `then` (and after A's next event) */
  stash_sim_complete_to(sim, A, then);
  CHECK_OK(p->event_query(x, e1));
  CHECK_OK(p->event_query(x, eb)); /* A waited for it before `then` */
  CHECK_EQ(p->event_query(x, e2), STASH_ERR_NOT_READY);
  CHECK_EQ(p->event_query(x, eb2), STASH_ERR_NOT_READY);
  CHECK(stash_sim_ordered_after(sim, A, then, B));
  CHECK(!stash_sim_ordered_after(sim, A, stash_sim_stream_point(sim, A), B));
  stash_sim_complete_to(sim, A, 0); /* an untracked stream's point: nothing */
  CHECK_EQ(p->event_query(x, e2), STASH_ERR_NOT_READY);
  stash_sim_complete_to(sim, A, UINT64_MAX); /* past the work queued: all of it */
  CHECK_OK(p->event_query(x, e2));
  CHECK_OK(p->event_query(x, eb2));
  CHECK_OK(p->event_destroy(x, e1));
  CHECK_OK(p->event_destroy(x, e2));
  CHECK_OK(p->event_destroy(x, eb));
  CHECK_OK(p->event_destroy(x, eb2));
  stash_sim_destroy(sim);
}

/* mem_free synchronizes, as cuMemFree does: the work queued on every stream is done when it
 * returns (policy:pytorch frees a segment another stream's work used, after an out-of-memory
 * retry, on that ground; fuzz_ops found the simulation saying otherwise). */
TEST(mem_free_completes_every_streams_work) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 64 * MiB, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  void* x = p->ctx;
  void *A = (void*)7, *B = (void*)8;
  uint64_t e, a = 0, b = 0;
  CHECK_OK(p->event_create(x, 0, &e));
  CHECK_OK(p->event_record(x, 0, e, A));
  uint64_t pt = stash_sim_stream_point(sim, A);
  CHECK_OK(p->mem_alloc(x, 0, 2 * MiB, &a));
  CHECK_OK(p->mem_alloc(x, 0, 2 * MiB, &b));
  CHECK(!stash_sim_ordered_after(sim, A, pt, B));
  CHECK_EQ(p->event_query(x, e), STASH_ERR_NOT_READY);
  CHECK_OK(p->mem_free(x, 0, a, 2 * MiB));
  CHECK(stash_sim_ordered_after(sim, A, pt, B));
  CHECK_OK(p->event_query(x, e));
  CHECK_OK(p->mem_free(x, 0, b, 2 * MiB));
  CHECK_OK(p->event_destroy(x, e));
  stash_sim_destroy(sim);
}

TEST(aliases_and_costs) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  void* x = p->ctx;
  double c0 = stash_sim_modeled_us(sim);
  uint64_t a, b, c;
  CHECK_OK(p->mem_alloc(x, 0, 2 * MiB, &a));
  CHECK_NEAR(stash_sim_modeled_us(sim) - c0, 31.0); /* cuMemAlloc of 2 MiB */
  CHECK_OK(p->mem_alloc(x, 0, 20 * MiB, &b));
  CHECK_OK(p->mem_alloc(x, 0, 512 * MiB, &c));
  CHECK_NEAR(stash_sim_modeled_us(sim) - c0, 31.0 + 36.0 + 61.0);
  /* As the driver: whole physical allocations only (offset 0, the whole size), at as many
   * addresses as wanted; unmapped whole (tools/gpu/probe_map.txt). */
  uint64_t va, h, h2;
  CHECK_OK(p->va_reserve(x, 0, 32 * MiB, &va));
  CHECK_OK(p->phys_create(x, 0, 8 * MiB, &h));
  CHECK_OK(p->phys_create(x, 0, 2 * MiB, &h2));
  CHECK_EQ(p->map(x, 0, va, 4 * MiB, h, 3 * MiB), STASH_ERR_INVALID); /* unaligned offset */
  CHECK_EQ(p->map(x, 0, va, 4 * MiB, h, 6 * MiB), STASH_ERR_INVALID); /* past the end */
  CHECK_EQ(p->map(x, 0, va, 2 * MiB, h, 2 * MiB), STASH_ERR_DRIVER);  /* a part */
  CHECK_STR_CONTAINS(_stash_provider_message(), "whole allocations only");
  CHECK_EQ(p->map(x, 0, va, 2 * MiB, h, 0), STASH_ERR_DRIVER);        /* a prefix */
  CHECK_OK(p->map(x, 0, va, 8 * MiB, h, 0));
  CHECK_OK(p->map(x, 0, va + 8 * MiB, 2 * MiB, h2, 0));
  CHECK_OK(p->map(x, 0, va + 16 * MiB, 8 * MiB, h, 0)); /* h again: an alias */
  double before = stash_sim_modeled_us(sim);
  CHECK_OK(p->set_access(x, 0, va, 10 * MiB)); /* two pieces, 8 + 2 MiB */
  CHECK_NEAR(stash_sim_modeled_us(sim) - before, 2 * 18.5 + 0.07 * 10 + 0.033 * 2);
  CHECK(stash_sim_is_usable(sim, 0, va, 10 * MiB));
  CHECK(!stash_sim_is_usable(sim, 0, va + 16 * MiB, 8 * MiB)); /* mapped, not accessible */
  CHECK_OK(p->set_access(x, 0, va + 16 * MiB, 8 * MiB));
  uint64_t p1 = 0, p2 = 0;
  CHECK_EQ(stash_sim_translate(sim, 0, va + 4096, 16 * MiB, &p1), 8 * MiB - 4096); /* one run */
  CHECK_EQ(stash_sim_translate(sim, 0, va + 16 * MiB + 4096, MiB, &p2), MiB);
  CHECK_EQ(p1, p2); /* the same physical byte behind both addresses */
  CHECK_EQ(stash_sim_translate(sim, 0, va + 10 * MiB, MiB, &p2), 0); /* nothing mapped */
  stash_sim_usage_t u;
  stash_sim_usage(sim, 0, &u);
  CHECK_EQ(u.mapped_pages, 9);
  CHECK_EQ(p->unmap(x, 0, va, 2 * MiB), STASH_ERR_INVALID); /* part of a mapping */
  CHECK_OK(p->phys_release(x, 0, h)); /* released while mapped: freed at the last unmap */
  stash_sim_usage(sim, 0, &u);
  CHECK_EQ(u.handles, 1);
  CHECK(u.used_bytes >= 10 * MiB);
  before = stash_sim_modeled_us(sim);
  CHECK_OK(p->unmap(x, 0, va, 10 * MiB)); /* two pieces */
  CHECK_NEAR(stash_sim_modeled_us(sim) - before, 2 * 12.5 + 0.035 * 10 + 0.012 * 2);
  CHECK_OK(p->unmap(x, 0, va + 16 * MiB, 8 * MiB));
  CHECK_OK(p->phys_release(x, 0, h2));
  CHECK_OK(p->va_free(x, 0, va, 32 * MiB));
  CHECK_OK(p->mem_free(x, 0, a, 2 * MiB));
  CHECK_OK(p->mem_free(x, 0, b, 20 * MiB));
  CHECK_OK(p->mem_free(x, 0, c, 512 * MiB));
  stash_sim_usage(sim, 0, &u);
  CHECK_EQ(u.used_bytes + u.mapped_pages + u.allocations + u.reservations, 0);
  stash_sim_destroy(sim);
}

TEST(fault_injection_counts) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  uint64_t a[4];
  stash_sim_fail_nth(sim, STASH_CALL_mem_alloc, 3, STASH_ERR_OOM);
  CHECK_OK(p->mem_alloc(p->ctx, 0, 2 * MiB, &a[0]));
  CHECK_OK(p->mem_alloc(p->ctx, 0, 2 * MiB, &a[1]));
  CHECK_EQ(p->mem_alloc(p->ctx, 0, 2 * MiB, &a[2]), STASH_ERR_OOM); /* the third, once */
  CHECK_OK(p->mem_alloc(p->ctx, 0, 2 * MiB, &a[2]));
  CHECK_EQ(stash_sim_calls(sim, STASH_CALL_mem_alloc), 4);
  CHECK_EQ(stash_sim_injected(sim), 1);
  stash_sim_fail_nth(sim, STASH_CALL_ANY, 2, STASH_ERR_DRIVER);
  size_t fr, tot;
  CHECK_OK(p->mem_info(p->ctx, 0, &fr, &tot));
  CHECK_EQ(p->mem_free(p->ctx, 0, a[0], 2 * MiB), STASH_ERR_DRIVER);
  CHECK_EQ(fr, tot - 6 * MiB); /* the failed call changed nothing */
  for (int i = 0; i < 3; i++) CHECK_OK(p->mem_free(p->ctx, 0, a[i], 2 * MiB));
  /* random: about p of the calls fail, the same ones for the same seed */
  int fails[2] = {0, 0};
  for (int run = 0; run < 2; run++) {
    stash_sim_fail_random(sim, STASH_CALL_mem_info, 0.25, 42, STASH_ERR_DRIVER);
    for (int i = 0; i < 1000; i++) fails[run] += p->mem_info(p->ctx, 0, &fr, &tot) != STASH_OK;
  }
  CHECK_EQ(fails[0], fails[1]);
  CHECK(fails[0] > 200 && fails[0] < 300);
  stash_sim_destroy(sim);
}

/* stash_sim_on_call's hook: every call that succeeded, once, with its bytes and its share of
 * stash_sim_modeled_us; failed calls and calls after the hook is removed are not told. */
TEST(every_call_is_told_with_its_cost) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  const stash_provider_t* p = stash_sim_provider(sim);
  void* x = p->ctx;
  fx_told_t t = {{0}, {0}, 0};
  size_t fr, tot;
  CHECK_OK(p->mem_info(x, 0, &fr, &tot)); /* before the hook: not told */
  double c0 = stash_sim_modeled_us(sim);
  stash_sim_on_call(sim, fx_tell, &t);
  uint64_t a, va, h;
  CHECK_OK(p->mem_alloc(x, 0, 20 * MiB, &a));
  stash_sim_fail_nth(sim, STASH_CALL_phys_create, 1, STASH_ERR_OOM);
  CHECK_EQ(p->phys_create(x, 0, 8 * MiB, &h), STASH_ERR_OOM); /* failed: not told */
  CHECK_EQ(p->map(x, 0, 0, 2 * MiB, 12345, 0), STASH_ERR_DRIVER); /* refused: not told */
  CHECK_OK(p->va_reserve(x, 0, 32 * MiB, &va));
  CHECK_OK(p->phys_create(x, 0, 8 * MiB, &h));
  CHECK_OK(p->map(x, 0, va, 8 * MiB, h, 0));
  CHECK_OK(p->set_access(x, 0, va, 8 * MiB));
  CHECK_OK(p->mem_info(x, 0, &fr, &tot));
  CHECK_OK(p->unmap(x, 0, va, 8 * MiB));
  CHECK_OK(p->phys_release(x, 0, h));
  CHECK_EQ(t.n[STASH_CALL_mem_alloc], 1);
  CHECK_EQ(t.bytes[STASH_CALL_mem_alloc], 20 * MiB);
  CHECK_EQ(t.n[STASH_CALL_phys_create], 1);
  CHECK_EQ(t.bytes[STASH_CALL_phys_create], 8 * MiB);
  CHECK_EQ(t.n[STASH_CALL_map], 1);
  CHECK_EQ(t.bytes[STASH_CALL_set_access], 8 * MiB);
  CHECK_EQ(t.bytes[STASH_CALL_va_reserve], 32 * MiB);
  CHECK_EQ(t.n[STASH_CALL_mem_info], 1);
  CHECK_EQ(t.bytes[STASH_CALL_mem_info], 0);
  CHECK_EQ(t.n[STASH_CALL_unmap], 1);
  CHECK_EQ(t.bytes[STASH_CALL_phys_release], 8 * MiB); /* its size, though it is gone */
  CHECK_NEAR(t.us, stash_sim_modeled_us(sim) - c0); /* every microsecond, once */
  CHECK_NEAR(t.us, 36.0 + 1.0 + 7.3 * 1 + (13.0 - 7.3) * 6.0 / 510.0 + 0.6 + 18.5 + 0.07 * 8 +
                       21.0 + 12.5 + 0.035 * 8 + 9.3);
  stash_sim_on_call(sim, NULL, &t); /* removed */
  double told = t.us;
  CHECK_OK(p->va_free(x, 0, va, 32 * MiB));
  CHECK_OK(p->mem_free(x, 0, a, 20 * MiB));
  CHECK_NEAR(t.us, told);
  CHECK_EQ(t.n[STASH_CALL_va_free] + t.n[STASH_CALL_mem_free], 0);
  stash_sim_destroy(sim);
}

int main(void) {
  RUN(placement_matches_the_driver);
  RUN(freed_ranges_are_reused_lowest_first);
  RUN(placement_at_traced_addresses);
  RUN(illegal_calls_are_errors);
  RUN(a_stream_wait_orders_the_waiting_streams_later_work_after_the_event);
  RUN(ordered_after_follows_completion_and_waits);
  RUN(mem_free_completes_every_streams_work);
  RUN(ordered_after_follows_a_chain_of_waits);
  RUN(complete_to_an_earlier_point_leaves_the_later_work_pending);
  RUN(aliases_and_costs);
  RUN(fault_injection_counts);
  RUN(every_call_is_told_with_its_cost);
  TEST_MAIN_END();
}
