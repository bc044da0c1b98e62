/* test-policy: each rule of policy:pytorch (PyTorch 2.11's caching allocator), on the
 * simulated device. Expected values follow from the rules of
 * c10/cuda/CUDACachingAllocator.cpp; the comments derive them. */
#include "fixture.h"

#define S1 ((void*)0x1)
#define S2 ((void*)0x2)

static uintptr_t U(void* p) { return (uintptr_t)p; }

TEST(rounding_and_small_pool) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  void* a = fx_alloc(&f, 1, NULL); /* 512-byte minimum block */
  CHECK_EQ(STAT(&f, allocated_bytes, ALL, current), 512);
  CHECK_EQ(STAT(&f, requested_bytes, ALL, current), 1);
  CHECK_EQ(STAT(&f, reserved_bytes, SMALL, current), 2 * MiB); /* a 2 MiB small segment */
  CHECK_EQ(STAT(&f, segment, SMALL, current), 1);
  void* b = fx_alloc(&f, 513, NULL); /* rounds to 1024, same segment, right after a */
  CHECK_EQ(U(b), U(a) + 512);
  CHECK_EQ(STAT(&f, allocated_bytes, ALL, current), 1536);
  void* c = fx_alloc(&f, 1 * MiB, NULL); /* exactly 1 MiB: still the small pool */
  CHECK_EQ(STAT(&f, allocation, SMALL, current), 3);
  CHECK_EQ(STAT(&f, segment, SMALL, current), 1);
  void* d = fx_alloc(&f, 1 * MiB + 1, NULL); /* large pool: 1 MiB + 512 in a 20 MiB segment */
  CHECK_EQ(STAT(&f, allocation, LARGE, current), 1);
  CHECK_EQ(STAT(&f, allocated_bytes, LARGE, current), 1 * MiB + 512);
  CHECK_EQ(STAT(&f, reserved_bytes, LARGE, current), 20 * MiB);
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 22 * MiB);
  fx_free(&f, a);
  fx_free(&f, b);
  fx_free(&f, c);
  fx_free(&f, d);
  fx_close(&f);
}

TEST(small_segments_pack_512k_blocks) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  void* p[5];
  for (int i = 0; i < 4; i++) p[i] = fx_alloc(&f, 512 * KiB, NULL);
  CHECK_EQ(STAT(&f, segment, SMALL, current), 1); /* 4 x 512 KiB fill one 2 MiB segment */
  for (int i = 1; i < 4; i++) CHECK_EQ(U(p[i]), U(p[i - 1]) + 512 * KiB);
  p[4] = fx_alloc(&f, 512 * KiB, NULL);
  CHECK_EQ(STAT(&f, segment, SMALL, current), 2);
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 4 * MiB);
  for (int i = 0; i < 5; i++) fx_free(&f, p[i]);
  fx_close(&f);
}

TEST(large_segment_sizes) {
  struct {
    size_t request, reserved, allocated;
  } const cases[] = {
      {3 * MiB, 20 * MiB, 3 * MiB},           /* < 10 MiB: a 20 MiB segment, split */
      {9 * MiB + 512 * KiB, 20 * MiB, 9 * MiB + 512 * KiB},
      {10 * MiB, 10 * MiB, 10 * MiB},         /* >= 10 MiB: rounded up to 2 MiB */
      {11 * MiB, 12 * MiB, 12 * MiB},         /* the 1 MiB left over is not split off */
      {25 * MiB + 1, 26 * MiB, 26 * MiB},     /* 1 MiB - 512 stays attached to the block */
      {154389504, 148 * MiB, 148 * MiB},      /* GPT-2's embedding: 148 MiB, 781 KiB kept */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fixture_t f;
    if (!fx_open(&f, "policy:pytorch", 0)) return;
    void* p = fx_alloc(&f, cases[i].request, NULL);
    CHECK_EQ(STAT(&f, reserved_bytes, LARGE, current), cases[i].reserved);
    CHECK_EQ(STAT(&f, allocated_bytes, LARGE, current), cases[i].allocated);
    CHECK_EQ(STAT(&f, requested_bytes, LARGE, current), cases[i].request);
    CHECK_EQ(fx_stats(&f).num_device_alloc, 1);
    fx_free(&f, p);
    fx_close(&f);
  }
}

TEST(roundup_power2_divisions) {
  struct {
    const char* conf;
    size_t request, block;
  } const cases[] = {
      {"roundup_power2_divisions:2", 2100, 3072},        /* 2048 + one 1024 division */
      {"roundup_power2_divisions:4", 1200, 1536},        /* 1200 <= 512*4: plain rounding */
      {"roundup_power2_divisions:4", 5 * MiB + 1, 6 * MiB}, /* 4 MiB + one 1 MiB step */
      {"roundup_power2_divisions:4", 4 * MiB, 4 * MiB},     /* powers of 2 stay */
      {"roundup_power2_divisions:8", 300 * MiB, 320 * MiB}, /* 256 MiB + one 32 MiB step */
      {"roundup_power2_divisions:[1:0,256:8]", 5 * MiB + 1, 5 * MiB + 512}, /* bucket 2: 0 */
      {"roundup_power2_divisions:[1:0,256:8]", 300 * MiB, 320 * MiB},       /* bucket 8: 8 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fixture_t f;
    char conf[128];
    snprintf(conf, sizeof conf, "policy:pytorch,%s", cases[i].conf);
    if (!fx_open(&f, conf, 0)) return;
    void* p = fx_alloc(&f, cases[i].request, NULL);
    CHECK_EQ(STAT(&f, active_bytes, ALL, current), cases[i].block);
    CHECK_EQ(STAT(&f, requested_bytes, ALL, current), cases[i].request);
    fx_free(&f, p);
    fx_close(&f);
  }
}

TEST(best_fit_by_size_then_address) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  void* a = fx_alloc(&f, 12 * MiB, NULL);
  void* b = fx_alloc(&f, 14 * MiB, NULL);
  void* c = fx_alloc(&f, 12 * MiB, NULL);
  CHECK_EQ(fx_stats(&f).num_device_alloc, 3);
  fx_free(&f, c);
  fx_free(&f, b);
  fx_free(&f, a);
  /* 11 MiB: the 12 MiB blocks fit best; between them the lower address wins. */
  void* lo = U(a) < U(c) ? a : c;
  void* hi = U(a) < U(c) ? c : a;
  void* x = fx_alloc(&f, 11 * MiB, NULL);
  CHECK_EQ(U(x), U(lo));
  CHECK_EQ(STAT(&f, allocated_bytes, ALL, current), 12 * MiB); /* 1 MiB left is not split */
  void* y = fx_alloc(&f, 11 * MiB, NULL);
  CHECK_EQ(U(y), U(hi));
  void* z = fx_alloc(&f, 11 * MiB, NULL); /* only the 14 MiB block is left: split, 3 MiB rest */
  CHECK_EQ(U(z), U(b));
  CHECK_EQ(STAT(&f, allocated_bytes, ALL, current), 35 * MiB);
  CHECK_EQ(STAT(&f, inactive_split, LARGE, current), 1);
  CHECK_EQ(STAT(&f, inactive_split_bytes, LARGE, current), 3 * MiB);
  CHECK_EQ(fx_stats(&f).num_device_alloc, 3);
  fx_free(&f, x);
  fx_free(&f, y);
  fx_free(&f, z);
  fx_close(&f);
}

TEST(coalescing_and_inactive_split) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  void* a = fx_alloc(&f, 3 * MiB, NULL);
  CHECK_EQ(STAT(&f, inactive_split, LARGE, current), 1);
  CHECK_EQ(STAT(&f, inactive_split_bytes, LARGE, current), 17 * MiB);
  void* b = fx_alloc(&f, 3 * MiB, NULL);
  void* c = fx_alloc(&f, 3 * MiB, NULL);
  CHECK_EQ(U(b), U(a) + 3 * MiB);
  CHECK_EQ(U(c), U(b) + 3 * MiB);
  CHECK_EQ(STAT(&f, inactive_split_bytes, LARGE, current), 11 * MiB);
  fx_free(&f, b); /* a hole between two live blocks */
  CHECK_EQ(STAT(&f, inactive_split, LARGE, current), 2);
  CHECK_EQ(STAT(&f, inactive_split_bytes, LARGE, current), 14 * MiB);
  fx_free(&f, a); /* merges with b's hole */
  CHECK_EQ(STAT(&f, inactive_split, LARGE, current), 2);
  CHECK_EQ(STAT(&f, inactive_split_bytes, LARGE, current), 17 * MiB);
  fx_free(&f, c); /* merges with both: the segment is whole again */
  CHECK_EQ(STAT(&f, inactive_split, LARGE, current), 0);
  CHECK_EQ(STAT(&f, inactive_split_bytes, LARGE, current), 0);
  void* d = fx_alloc(&f, 20 * MiB, NULL); /* the whole segment, no new one */
  CHECK_EQ(U(d), U(a));
  CHECK_EQ(fx_stats(&f).num_device_alloc, 1);
  /* A segment holding a live block cannot be released. */
  CHECK_OK(stash_heap_empty_cache(f.heap));
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 20 * MiB);
  fx_free(&f, d);
  CHECK_OK(stash_heap_empty_cache(f.heap));
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 0);
  CHECK_EQ(STAT(&f, segment, ALL, current), 0);
  CHECK_EQ(fx_stats(&f).num_device_free, 1);
  stash_sim_usage_t u;
  stash_sim_usage(f.sim, 0, &u);
  CHECK_EQ(u.used_bytes, 0); /* given back to the device */
  fx_close(&f);
}

TEST(per_stream_pools) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  void* a = fx_alloc(&f, 4 * MiB, S1);
  fx_free(&f, a);
  void* b = fx_alloc(&f, 4 * MiB, S2); /* S1's free block is not used for S2 */
  CHECK(U(b) != U(a));
  CHECK_EQ(fx_stats(&f).num_device_alloc, 2);
  void* c = fx_alloc(&f, 4 * MiB, S1); /* S1 gets its own block back */
  CHECK_EQ(U(c), U(a));
  CHECK_EQ(fx_stats(&f).num_device_alloc, 2);
  fx_free(&f, b);
  fx_free(&f, c);
  fx_close(&f);
}

static int count_pending(const stash_segment_info_t* s, const stash_block_info_t* b, void* arg) {
  for (size_t i = 0; i < s->nblocks; i++) *(int*)arg += b[i].state == STASH_BLOCK_PENDING_FREE;
  return 0;
}

TEST(record_stream_waits_for_events) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  void* a = fx_alloc(&f, 4 * MiB, S1);
  CHECK_OK(stash_heap_record_stream(f.heap, a, S2));
  CHECK_OK(stash_heap_record_stream(f.heap, a, S2)); /* recorded once */
  fx_free(&f, a);
  CHECK_EQ(STAT(&f, allocation, ALL, current), 0);
  CHECK_EQ(STAT(&f, allocated_bytes, ALL, current), 0);
  CHECK_EQ(STAT(&f, active, ALL, current), 1); /* active until S2's work is done */
  CHECK_EQ(STAT(&f, active_bytes, ALL, current), 4 * MiB);
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_event_record), 1);
  int pending = 0;
  stash_heap_visit(f.heap, count_pending, &pending);
  CHECK_EQ(pending, 1);
  void* b = fx_alloc(&f, 4 * MiB, S1); /* not a: its event has not completed */
  CHECK(U(b) != U(a));
  CHECK(stash_sim_calls(f.sim, STASH_CALL_event_query) >= 1);
  fx_free(&f, b);
  stash_sim_complete(f.sim, S2);
  void* c = fx_alloc(&f, 4 * MiB, S1); /* the malloc processes the event: a is reusable */
  CHECK_EQ(U(c), U(a));
  CHECK_EQ(STAT(&f, active, ALL, current), 1);
  fx_free(&f, c);
  /* A use on the allocation stream itself needs no event. */
  void* d = fx_alloc(&f, 4 * MiB, S1);
  CHECK_OK(stash_heap_record_stream(f.heap, d, S1));
  fx_free(&f, d);
  CHECK_EQ(STAT(&f, active, ALL, current), 0);
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_event_record), 1);
  /* Events are pooled: a second cross-stream free reuses the event. */
  void* e = fx_alloc(&f, 4 * MiB, S1);
  CHECK_OK(stash_heap_record_stream(f.heap, e, S2));
  fx_free(&f, e);
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_event_create), 1);
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_event_record), 2);
  /* empty_cache waits for every pending event, then releases. */
  CHECK_OK(stash_heap_empty_cache(f.heap));
  CHECK_EQ(fx_stats(&f).num_sync_all_streams, 1);
  CHECK_EQ(STAT(&f, active, ALL, current), 0);
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 0);
  fx_close(&f);
}

TEST(oom_frees_cache_and_retries) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 64 * MiB)) return;
  void* a = fx_alloc(&f, 40 * MiB, NULL);
  fx_free(&f, a); /* 40 MiB cached, 24 MiB left on the device */
  void* b = fx_alloc(&f, 50 * MiB, NULL);
  CHECK(b != NULL);
  stash_stats_t s = fx_stats(&f);
  CHECK_EQ(s.num_alloc_retries, 1);
  CHECK_EQ(s.num_device_free, 1);
  CHECK_EQ(s.num_device_alloc, 2);
  CHECK_EQ(s.num_sync_all_streams, 1);
  CHECK_EQ(s.num_ooms, 0);
  CHECK_EQ(s.reserved_bytes[STASH_STAT_ALL].current, 50 * MiB);
  CHECK_EQ(s.reserved_bytes[STASH_STAT_ALL].peak, 50 * MiB);
  fx_free(&f, b);
  fx_close(&f);
}

TEST(oom_message_is_exact) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 64 * MiB)) return;
  void* keep = fx_alloc(&f, 40 * MiB, NULL);
  void* small = fx_alloc(&f, 1000, NULL);
  fx_free(&f, small);
  void* p = (void*)0x1;
  CHECK_EQ(stash_heap_alloc(f.heap, 30 * MiB, NULL, &p), STASH_ERR_OOM);
  CHECK(p == NULL);
  const char* msg = stash_last_error();
  CHECK_STR_CONTAINS(msg, "tried to allocate 30.00 MiB (31457280 bytes requested");
  CHECK_STR_CONTAINS(msg, "total capacity of 64.00 MiB");
  CHECK_STR_CONTAINS(msg, "of which 24.00 MiB is free"); /* the small segment went back */
  CHECK_STR_CONTAINS(msg, "40.00 MiB allocated");
  CHECK_STR_CONTAINS(msg, "0 bytes reserved but unallocated");
  CHECK_STR_CONTAINS(msg, "largest free block is 0 bytes");
  stash_stats_t s = fx_stats(&f);
  CHECK_EQ(s.num_ooms, 1);
  CHECK_EQ(s.num_alloc_retries, 1);
  CHECK_OK(stash_heap_check(f.heap));
  fx_free(&f, keep);
  void* q = fx_alloc(&f, 30 * MiB, NULL); /* the heap still works */
  CHECK(q != NULL);
  fx_free(&f, q);
  fx_close(&f);
}

TEST(oversize_blocks_and_release_available) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch,max_split_size_mb:20", 100 * MiB)) return;
  void* a = fx_alloc(&f, 30 * MiB, NULL);
  void* b = fx_alloc(&f, 30 * MiB, NULL);
  CHECK_EQ(fx_stats(&f).oversize_segments.current, 2);
  CHECK_EQ(fx_stats(&f).oversize_allocations.current, 2);
  CHECK_EQ(fx_stats(&f).max_split_size, 20 * MiB);
  fx_free(&f, a);
  fx_free(&f, b);
  CHECK_EQ(fx_stats(&f).oversize_allocations.current, 0);
  /* 60 MiB does not fit next to 60 MiB of cache: the oversize blocks are freed, largest
   * (then highest address) first, until 60 MiB are free - without the full retry. */
  void* c = fx_alloc(&f, 60 * MiB, NULL);
  CHECK(c != NULL);
  stash_stats_t s = fx_stats(&f);
  CHECK_EQ(s.num_device_free, 2);
  CHECK_EQ(s.num_alloc_retries, 0);
  CHECK_EQ(s.num_sync_all_streams, 0);
  fx_free(&f, c);
  fx_close(&f);

  /* An oversize block never serves a small request, and serves a large one only within
   * max_non_split_rounding. */
  if (!fx_open(&f, "policy:pytorch,max_split_size_mb:20", 0)) return;
  a = fx_alloc(&f, 40 * MiB, NULL);
  fx_free(&f, a);
  b = fx_alloc(&f, 5 * MiB, NULL); /* not from the 40 MiB block */
  CHECK(U(b) != U(a));
  CHECK_EQ(fx_stats(&f).num_device_alloc, 2);
  c = fx_alloc(&f, 30 * MiB, NULL); /* 40 < 30 + 20: the whole block, unsplit */
  CHECK_EQ(U(c), U(a));
  CHECK_EQ(STAT(&f, allocated_bytes, LARGE, current), 40 * MiB + 5 * MiB);
  fx_free(&f, c);
  void* d = fx_alloc(&f, 20 * MiB, NULL); /* 40 >= 20 + 20: too much waste, new segment */
  CHECK(U(d) != U(a));
  CHECK_EQ(fx_stats(&f).num_device_alloc, 3);
  fx_free(&f, b);
  fx_free(&f, d);
  fx_close(&f);

  /* Exactly max_split_size is already oversize. */
  if (!fx_open(&f, "policy:pytorch,max_split_size_mb:20", 0)) return;
  a = fx_alloc(&f, 20 * MiB, NULL);
  CHECK_EQ(fx_stats(&f).oversize_allocations.current, 1);
  fx_free(&f, a);
  b = fx_alloc(&f, 5 * MiB, NULL);
  CHECK(U(b) != U(a));
  CHECK_EQ(fx_stats(&f).num_device_alloc, 2);
  fx_free(&f, b);
  fx_close(&f);

  if (!fx_open(&f, "policy:pytorch,max_split_size_mb:20,max_non_split_rounding_mb:40", 0)) return;
  a = fx_alloc(&f, 40 * MiB, NULL);
  fx_free(&f, a);
  d = fx_alloc(&f, 20 * MiB, NULL); /* 40 < 20 + 40: allowed now */
  CHECK_EQ(U(d), U(a));
  fx_free(&f, d);
  fx_close(&f);
}

TEST(garbage_collection) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch,garbage_collection_threshold:0.5,per_process_memory_fraction:0.5",
               1 * GiB))
    return;
  void* p[3];
  for (int i = 0; i < 3; i++) p[i] = fx_alloc(&f, 100 * MiB, NULL);
  for (int i = 0; i < 3; i++) fx_free(&f, p[i]);
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 300 * MiB);
  /* A miss with 300 MiB reserved > 0.5 * 512 MiB: the unsplit cached segments at least as
   * old as the average are freed before asking the device. */
  void* q = fx_alloc(&f, 150 * MiB, NULL);
  CHECK(q != NULL);
  stash_stats_t s = fx_stats(&f);
  CHECK_EQ(s.num_device_free, 3);
  CHECK_EQ(s.num_alloc_retries, 0);
  CHECK_EQ(s.reserved_bytes[STASH_STAT_ALL].current, 150 * MiB);
  fx_free(&f, q);
  fx_close(&f);
  /* Without the threshold the same sequence keeps the cache. */
  if (!fx_open(&f, "policy:pytorch,per_process_memory_fraction:0.5", 1 * GiB)) return;
  for (int i = 0; i < 3; i++) p[i] = fx_alloc(&f, 100 * MiB, NULL);
  for (int i = 0; i < 3; i++) fx_free(&f, p[i]);
  q = fx_alloc(&f, 150 * MiB, NULL);
  CHECK_EQ(fx_stats(&f).num_device_free, 0);
  fx_free(&f, q);
  fx_close(&f);
}

TEST(memory_fraction) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch,per_process_memory_fraction:0.25", 1 * GiB)) return;
  void* p = NULL;
  CHECK_EQ(stash_heap_alloc(f.heap, 300 * MiB, NULL, &p), STASH_ERR_OOM);
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_mem_alloc), 0); /* refused before the device */
  CHECK_STR_CONTAINS(stash_last_error(), "memory fraction allows this heap 256.00 MiB");
  CHECK_EQ(stash_heap_set_memory_fraction(f.heap, 1.5), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_set_memory_fraction(f.heap, -0.1), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_set_memory_fraction(f.heap, 0.0 / 0.0), STASH_ERR_INVALID);
  CHECK_OK(stash_heap_set_memory_fraction(f.heap, 1.0)); /* 1 lifts the limit */
  p = fx_alloc(&f, 300 * MiB, NULL);
  CHECK_OK(stash_heap_set_memory_fraction(f.heap, 0.5)); /* 512 MiB: 300 + 300 is over */
  void* q = NULL;
  CHECK_EQ(stash_heap_alloc(f.heap, 300 * MiB, NULL, &q), STASH_ERR_OOM);
  fx_free(&f, p);
  q = fx_alloc(&f, 300 * MiB, NULL); /* the cached 300 MiB block serves it */
  fx_free(&f, q);
  size_t fr = 0, tot = 0;
  CHECK_OK(stash_heap_mem_get_info(f.heap, &fr, &tot));
  CHECK_EQ(tot, 1 * GiB);
  CHECK_EQ(fr, 1 * GiB - 300 * MiB);
  fx_close(&f);
}

TEST(expandable_segments) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch,expandable_segments:True", 0)) return;
  void* a = fx_alloc(&f, 3 * MiB, NULL);
  stash_stats_t s = fx_stats(&f);
  CHECK_EQ(s.reserved_bytes[STASH_STAT_LARGE].current, 20 * MiB); /* one 20 MiB page */
  CHECK_EQ(s.num_device_alloc, 1);
  CHECK_EQ(s.segment[STASH_STAT_ALL].current, 0); /* mapping does not count segments */
  CHECK_EQ(s.allocated_bytes[STASH_STAT_ALL].current, 3 * MiB);
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_va_reserve), 1);
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_phys_create), 1);
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_set_access), 1);
  /* 30 MiB: the 17 MiB free tail grows by one more page, contiguously. */
  void* b = fx_alloc(&f, 30 * MiB, NULL);
  CHECK_EQ(U(b), U(a) + 3 * MiB);
  s = fx_stats(&f);
  CHECK_EQ(s.reserved_bytes[STASH_STAT_LARGE].current, 40 * MiB);
  CHECK_EQ(s.num_device_alloc, 2);
  CHECK_EQ(s.allocated_bytes[STASH_STAT_ALL].current, 33 * MiB);
  /* With expandable segments any remainder of 512 bytes or more is split off: 6 MiB comes
   * from the 7 MiB tail and leaves 1 MiB free (a plain segment would keep it attached). */
  void* c = fx_alloc(&f, 6 * MiB, NULL);
  CHECK_EQ(U(c), U(b) + 30 * MiB);
  CHECK_EQ(fx_stats(&f).num_device_alloc, 2);
  fx_free(&f, a);
  fx_free(&f, b);
  fx_free(&f, c);
  CHECK_EQ(STAT(&f, inactive_split, ALL, current), 0); /* not counted for expandable */
  CHECK_OK(stash_heap_empty_cache(f.heap));
  s = fx_stats(&f);
  CHECK_EQ(s.reserved_bytes[STASH_STAT_ALL].current, 0);
  CHECK_EQ(s.num_device_free, 1); /* one unmap of the free range */
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_unmap), 2); /* two pages */
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_va_free), 1); /* the empty segment is gone */
  /* The small pool maps 2 MiB pages. */
  void* d = fx_alloc(&f, 1000, NULL);
  CHECK_EQ(STAT(&f, reserved_bytes, SMALL, current), 2 * MiB);
  fx_free(&f, d);
  fx_close(&f);
}

TEST(expandable_unmaps_only_whole_free_pages) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch,expandable_segments:True", 0)) return;
  void* a = fx_alloc(&f, 30 * MiB, NULL); /* pages 0-1 */
  void* b = fx_alloc(&f, 25 * MiB, NULL); /* 30..55 MiB: pages 1-2 */
  void* c = fx_alloc(&f, 2 * MiB, NULL);  /* 55..57 MiB: page 2 */
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 60 * MiB);
  fx_free(&f, b);
  /* b's range 30..55 MiB covers no whole page (page 1 is 20..40, page 2 is 40..60, both
   * partly used): nothing can be unmapped. */
  CHECK_OK(stash_heap_empty_cache(f.heap));
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 60 * MiB);
  fx_free(&f, a); /* now 0..55 MiB is free: pages 0 and 1 are whole */
  CHECK_OK(stash_heap_empty_cache(f.heap));
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 20 * MiB);
  CHECK_OK(stash_heap_check(f.heap));
  /* The freed pages are mapped again for a new request at the lowest address. */
  void* d = fx_alloc(&f, 35 * MiB, NULL);
  CHECK_EQ(U(d), U(a));
  CHECK_EQ(STAT(&f, reserved_bytes, ALL, current), 60 * MiB);
  fx_free(&f, c);
  fx_free(&f, d);
  fx_close(&f);
}

int main(void) {
  RUN(rounding_and_small_pool);
  RUN(small_segments_pack_512k_blocks);
  RUN(large_segment_sizes);
  RUN(roundup_power2_divisions);
  RUN(best_fit_by_size_then_address);
  RUN(coalescing_and_inactive_split);
  RUN(per_stream_pools);
  RUN(record_stream_waits_for_events);
  RUN(oom_frees_cache_and_retries);
  RUN(oom_message_is_exact);
  RUN(oversize_blocks_and_release_available);
  RUN(garbage_collection);
  RUN(memory_fraction);
  RUN(expandable_segments);
  RUN(expandable_unmaps_only_whole_free_pages);
  TEST_MAIN_END();
}
