/* test-timed: tools/timed_provider.c - the provider stash-replay puts between a heap and the
 * CUDA driver to measure each call (measured_driver_us, --calls on a GPU). Tested here on the
 * simulated device, which counts every call it is given: the wrapper must forward every one,
 * count and time each that succeeds, tell its hook, and leave out what fails. */
#include <string.h>

#include "fixture.h"
#include "timed_provider.h"

/* A training-step-like workload through a heap on the wrapped simulated device. */
static void workload(stash_heap_t* heap) {
  void* p[64];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 64; i++)
      CHECK_OK(stash_heap_alloc(heap, (size_t)(i % 7 + 1) * (3u << 20) + (size_t)i * 4096,
                                (void*)(uintptr_t)(i % 2 ? 0x7 : 0), &p[i]));
    for (int i = 0; i < 64; i++) CHECK_OK(stash_heap_free(heap, p[i]));
  }
  CHECK_OK(stash_heap_empty_cache(heap));
}

static void one_policy(const char* conf_text) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  timed_provider_t timed;
  fx_told_t told = {{0}, {0}, 0};
  timed_provider_init(&timed, stash_sim_provider(sim), fx_tell, &told);
  stash_conf_t conf;
  stash_conf_init(&conf);
  CHECK_OK(stash_conf_parse(&conf, conf_text));
  stash_heap_t* heap;
  CHECK_OK(stash_heap_create(&conf, &timed.table, 0, &heap));
  workload(heap);
  /* every call the heap made reached the simulated device, and was counted once */
  uint64_t total = 0;
  for (int k = 0; k < STASH_CALL_COUNT; k++) {
    CHECK_EQ(timed.calls[k], stash_sim_calls(sim, (stash_provider_call_t)k));
    CHECK_EQ(told.n[k], timed.calls[k]);
    CHECK(timed.us[k] >= 0.0);
    total += timed.calls[k];
  }
  CHECK(total > 10);
  CHECK(timed.calls[STASH_CALL_mem_info] >= 1);
  CHECK(timed.total_us >= 0.0 && told.us == timed.total_us);
  /* a call that fails is forwarded (the simulated device counts it), and neither counted
   * nor told */
  stash_provider_call_t failing = strstr(conf_text, "stash") || strstr(conf_text, "expandable")
                                      ? STASH_CALL_phys_create
                                      : STASH_CALL_mem_alloc;
  stash_sim_fail_nth(sim, failing, 1, STASH_ERR_OOM);
  void* big;
  stash_status_t st = stash_heap_alloc(heap, (size_t)1 << 30, NULL, &big);
  CHECK_EQ(stash_sim_injected(sim), 1);
  if (st == STASH_OK) CHECK_OK(stash_heap_free(heap, big));
  for (int k = 0; k < STASH_CALL_COUNT; k++)
    CHECK_EQ(timed.calls[k] + (k == (int)failing), stash_sim_calls(sim, (stash_provider_call_t)k));
  CHECK_EQ(told.n[failing], timed.calls[failing]);
  CHECK_OK(stash_heap_destroy(heap));
  stash_sim_destroy(sim);
}

TEST(forwards_counts_and_times_every_call) {
  one_policy("policy:stash");
  one_policy("policy:pytorch");
  one_policy("policy:pytorch,expandable_segments:True");
}

TEST(what_the_inner_provider_lacks_stays_missing) {
  stash_sim_t* sim;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  stash_provider_t plain = *stash_sim_provider(sim); /* no virtual memory */
  plain.va_reserve = NULL;
  plain.va_free = NULL;
  plain.phys_create = NULL;
  plain.phys_release = NULL;
  plain.map = NULL;
  plain.unmap = NULL;
  plain.set_access = NULL;
  timed_provider_t timed;
  timed_provider_init(&timed, &plain, NULL, NULL);
  CHECK(timed.table.map == NULL && timed.table.set_access == NULL);
  CHECK(timed.table.mem_alloc != NULL && timed.table.event_query != NULL);
  CHECK(timed.table.ctx == &timed && timed.table.name == plain.name);
  /* a heap on it works with plain segments, and its calls are counted with no hook */
  stash_conf_t conf;
  stash_conf_init(&conf);
  CHECK_OK(stash_conf_parse(&conf, "policy:pytorch"));
  stash_heap_t* heap;
  CHECK_OK(stash_heap_create(&conf, &timed.table, 0, &heap));
  workload(heap);
  CHECK_EQ(timed.calls[STASH_CALL_mem_alloc], stash_sim_calls(sim, STASH_CALL_mem_alloc));
  CHECK(timed.calls[STASH_CALL_mem_alloc] > 0);
  CHECK_OK(stash_heap_destroy(heap));
  stash_sim_destroy(sim);
}

int main(void) {
  RUN(forwards_counts_and_times_every_call);
  RUN(what_the_inner_provider_lacks_stays_missing);
  TEST_MAIN_END();
}
