/* test-errors: every bad input gets a clear status and changes nothing. */
#include <stddef.h>
#include <stdint.h>

#include "fixture.h"

static int same_stats(const stash_stats_t* a, const stash_stats_t* b) {
  return memcmp(a, b, sizeof *a) == 0;
}

TEST(null_arguments) {
  void* p = (void*)0x1;
  CHECK_EQ(stash_heap_alloc(NULL, 10, NULL, &p), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "heap is NULL");
  CHECK_EQ(stash_heap_free(NULL, p), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_record_stream(NULL, p, NULL), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_empty_cache(NULL), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_set_memory_fraction(NULL, 0.5), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_check(NULL), STASH_ERR_INVALID);
  CHECK_OK(stash_heap_destroy(NULL));
  stash_heap_t* h = (stash_heap_t*)0x1;
  CHECK_EQ(stash_heap_create(NULL, NULL, 0, &h), STASH_ERR_INVALID);
  CHECK(h == NULL);
  CHECK_EQ(stash_heap_create(NULL, NULL, 0, NULL), STASH_ERR_INVALID);
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  CHECK_EQ(stash_heap_alloc(f.heap, 10, NULL, NULL), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_mem_get_info(f.heap, NULL, NULL), STASH_ERR_INVALID);
  stash_stats_t s = {0}; /* size unset */
  CHECK_EQ(stash_heap_stats(f.heap, &s), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_visit(f.heap, NULL, NULL), STASH_ERR_INVALID);
  fx_close(&f);
}

TEST(bad_devices_and_providers) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(2, 0, &sim));
  stash_heap_t* h = NULL;
  CHECK_EQ(stash_heap_create(NULL, stash_sim_provider(sim), 2, &h), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "device 2 does not exist");
  CHECK_EQ(stash_heap_create(NULL, stash_sim_provider(sim), -1, &h), STASH_ERR_INVALID);
  stash_provider_t bad = *stash_sim_provider(sim);
  bad.version = 99;
  CHECK_EQ(stash_heap_create(NULL, &bad, 0, &h), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "version 99");
  /* A version 1 table is the size it had then; of any other size it is refused. */
  bad = *stash_sim_provider(sim);
  bad.version = 1;
  CHECK_EQ(stash_heap_create(NULL, &bad, 0, &h), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "has table version 1 (size");
  bad.version = 2;
  bad.size = (uint32_t)offsetof(stash_provider_t, stream_wait);
  CHECK_EQ(stash_heap_create(NULL, &bad, 0, &h), STASH_ERR_INVALID);
  bad.version = 0;
  bad.size = sizeof bad;
  CHECK_EQ(stash_heap_create(NULL, &bad, 0, &h), STASH_ERR_INVALID);
  bad = *stash_sim_provider(sim);
  bad.mem_alloc = NULL;
  CHECK_EQ(stash_heap_create(NULL, &bad, 0, &h), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "mem_alloc");
  /* Expandable segments need the virtual-memory functions. */
  bad = *stash_sim_provider(sim);
  bad.map = NULL;
  stash_conf_t conf;
  stash_conf_init(&conf);
  CHECK_EQ(stash_heap_create(&conf, &bad, 0, &h), STASH_ERR_UNSUPPORTED); /* policy:stash */
  CHECK_STR_CONTAINS(stash_last_error(), "policy:stash needs virtual memory functions");
  CHECK(h == NULL);
  conf.policy = STASH_POLICY_PYTORCH;
  conf.expandable_segments = true;
  CHECK_EQ(stash_heap_create(&conf, &bad, 0, &h), STASH_ERR_UNSUPPORTED);
  conf.expandable_segments = false;
  CHECK_OK(stash_heap_create(&conf, &bad, 1, &h)); /* fine without them */
  CHECK_OK(stash_heap_destroy(h));
  /* A hand-filled conf out of range is refused. */
  stash_conf_init(&conf);
  conf.policy = STASH_POLICY_PYTORCH;
  conf.max_split_size = 1 * MiB;
  CHECK_EQ(stash_heap_create(&conf, stash_sim_provider(sim), 0, &h), STASH_ERR_CONF);
  stash_conf_init(&conf);
  conf.per_process_memory_fraction = 2.0;
  CHECK_EQ(stash_heap_create(&conf, stash_sim_provider(sim), 0, &h), STASH_ERR_CONF);
  stash_conf_init(&conf);
  conf.size = 4;
  CHECK_EQ(stash_heap_create(&conf, stash_sim_provider(sim), 0, &h), STASH_ERR_CONF);
  stash_sim_destroy(sim);
}

TEST(free_of_foreign_double_and_interior_pointers) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  void* a = fx_alloc(&f, 4 * MiB, NULL);
  void* b = fx_alloc(&f, 1000, NULL);
  stash_stats_t before = fx_stats(&f);
  CHECK_OK(stash_heap_free(f.heap, NULL)); /* free(NULL) does nothing */
  CHECK_EQ(stash_heap_free(f.heap, (void*)0xdeadbeef000), STASH_ERR_BAD_POINTER);
  CHECK_STR_CONTAINS(stash_last_error(), "0xdeadbeef000 is not a live allocation");
  CHECK_EQ(stash_heap_free(f.heap, (char*)a + 512), STASH_ERR_BAD_POINTER); /* interior */
  CHECK_EQ(stash_heap_record_stream(f.heap, (char*)a + 512, (void*)2), STASH_ERR_BAD_POINTER);
  stash_stats_t after = fx_stats(&f);
  CHECK(same_stats(&before, &after));
  CHECK_OK(stash_heap_check(f.heap));
  fx_free(&f, a);
  before = fx_stats(&f);
  CHECK_EQ(stash_heap_free(f.heap, a), STASH_ERR_BAD_POINTER); /* double free */
  CHECK_EQ(stash_heap_record_stream(f.heap, a, (void*)2), STASH_ERR_BAD_POINTER);
  after = fx_stats(&f);
  CHECK(same_stats(&before, &after));
  fx_free(&f, b);
  fx_close(&f);
}

TEST(pointer_of_another_heap_is_foreign) {
  /* Two heaps on two devices of one simulated machine: distinct addresses. */
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(2, 0, &sim));
  stash_heap_t *h0 = NULL, *h1 = NULL;
  CHECK_OK(stash_heap_create(NULL, stash_sim_provider(sim), 0, &h0));
  CHECK_OK(stash_heap_create(NULL, stash_sim_provider(sim), 1, &h1));
  void *a = NULL, *c = NULL;
  CHECK_OK(stash_heap_alloc(h0, 1000, NULL, &a));
  CHECK_OK(stash_heap_alloc(h1, 1000, NULL, &c));
  CHECK(a != c);
  CHECK_EQ(stash_heap_free(h0, c), STASH_ERR_BAD_POINTER);
  CHECK_OK(stash_heap_free(h1, c));
  CHECK_OK(stash_heap_free(h0, a));
  CHECK_OK(stash_heap_destroy(h0));
  CHECK_OK(stash_heap_destroy(h1));
  stash_sim_destroy(sim);
}

TEST(absurd_sizes_are_out_of_memory) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 511, SIZE_MAX / 2, (size_t)1 << 60,
                          ((size_t)1 << 60) - 1, (size_t)1 << 50, 150109880320ULL + 1};
  int64_t ooms = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void* p = (void*)0x1;
    CHECK_EQ(stash_heap_alloc(f.heap, sizes[i], NULL, &p), STASH_ERR_OOM);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(stash_last_error(), "out of memory");
    ooms++;
    CHECK_EQ(fx_stats(&f).num_ooms, ooms);
    CHECK_OK(stash_heap_check(f.heap));
  }
  stash_stats_t s = fx_stats(&f);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 0);
  CHECK_EQ(s.reserved_bytes[STASH_STAT_ALL].current, 0);
  void* q = fx_alloc(&f, 100 * MiB, NULL); /* still works */
  fx_free(&f, q);
  fx_close(&f);
}

TEST(size_zero_is_null) {
  fixture_t f;
  if (!fx_open(&f, "policy:pytorch", 0)) return;
  void* p = (void*)0x1;
  stash_stats_t before = fx_stats(&f);
  CHECK_OK(stash_heap_alloc(f.heap, 0, NULL, &p));
  CHECK(p == NULL);
  stash_stats_t after = fx_stats(&f);
  CHECK(same_stats(&before, &after));
  CHECK_EQ(stash_sim_calls(f.sim, STASH_CALL_ANY), 1); /* only heap creation's mem_info */
  fx_close(&f);
}

TEST(status_names) {
  CHECK(strcmp(stash_status_name(STASH_ERR_OOM), "STASH_ERR_OOM") == 0);
  CHECK(strcmp(stash_status_text(STASH_OK), "success") == 0);
  CHECK(strcmp(stash_status_name((stash_status_t)999), "STASH_ERR_UNKNOWN") == 0);
  CHECK(strcmp(stash_provider_call_name(STASH_CALL_map), "map") == 0);
}

static int handler_calls;
static stash_status_t handler_status;
static void handler(stash_status_t st, const char* msg, void* arg) {
  (void)msg;
  handler_calls += *(int*)arg;
  handler_status = st;
}

TEST(error_handler_sees_errors) {
  int one = 1;
  stash_set_error_handler(handler, &one);
  fixture_t f;
  if (fx_open(&f, "policy:pytorch", 0)) {
    CHECK_EQ(stash_heap_free(f.heap, (void*)0x1000), STASH_ERR_BAD_POINTER);
    CHECK_EQ(handler_calls, 1);
    CHECK_EQ(handler_status, STASH_ERR_BAD_POINTER);
    fx_close(&f);
  }
  stash_set_error_handler(NULL, NULL);
}

int main(void) {
  RUN(null_arguments);
  RUN(bad_devices_and_providers);
  RUN(free_of_foreign_double_and_interior_pointers);
  RUN(pointer_of_another_heap_is_foreign);
  RUN(absurd_sizes_are_out_of_memory);
  RUN(size_zero_is_null);
  RUN(status_names);
  RUN(error_handler_sees_errors);
  TEST_MAIN_END();
}
