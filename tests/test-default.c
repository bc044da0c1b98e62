/* test-default: the process-wide default heaps, configured from the environment, and
 * stash_malloc / stash_free. The environment is read when a heap is first made, so the
 * steps run in order. */
#include <pthread.h>

#include "fixture.h"
#include "stash_plugins.h"

static void* churn(void* arg) {
  (void)arg;
  for (int i = 0; i < 2000; i++) {
    void* p = stash_malloc((size_t)(i % 97 + 1) * 4096, NULL);
    if (!p) return (void*)1;
    stash_free(p);
  }
  return NULL;
}

/* A thread capturing graphs one after another (a pool each, released at once), and one
 * allocating on its own stream meanwhile: its allocations may land in an open pool and be
 * freed after that pool was released (ThreadSanitizer runs this test). */
static void* capturer(void* arg) {
  (void)arg;
  for (uint64_t i = 0; i < 40; i++) {
    stash_torch_begin_allocate_to_pool(0, 9, i, NULL);
    void* a = stash_torch_malloc(3 * MiB, 0, (void*)11);
    void* b = stash_torch_malloc(4096, 0, (void*)11);
    if (!a || !b) return (void*)1;
    stash_torch_free(a, 3 * MiB, 0, (void*)11);
    stash_torch_end_allocate_to_pool(0, 9, i);
    stash_torch_free(b, 4096, 0, (void*)11);
    stash_torch_release_pool(0, 9, i);
    stash_torch_reset();
  }
  return NULL;
}

static void* eager(void* arg) {
  (void)arg;
  void* keep[8] = {NULL};
  for (int i = 0; i < 1500; i++) {
    void* p = stash_torch_malloc((size_t)(i % 13 + 1) * 256 * 1024, 0, (void*)12);
    if (!p) return (void*)1;
    int k = i % 8;
    if (keep[k]) stash_torch_free(keep[k], 0, 0, (void*)12);
    keep[k] = p;
  }
  for (int k = 0; k < 8; k++) stash_torch_free(keep[k], 0, 0, (void*)12);
  return NULL;
}

int main(void) {
  stash_heap_t* h = NULL;
  th_current = "bad_provider";
  setenv("STASH_PROVIDER", "bogus", 1);
  CHECK_EQ(stash_default_heap(0, &h), STASH_ERR_CONF);
  CHECK_STR_CONTAINS(stash_last_error(), "'bogus'");
  CHECK(stash_malloc(100, NULL) == NULL);
  const stash_provider_t* cuda;
  if (stash_cuda_provider(&cuda) != STASH_OK) { /* no GPU here: cuda is refused, clearly */
    char why[512];
    snprintf(why, sizeof why, "%s", stash_last_error());
    setenv("STASH_PROVIDER", "cuda", 1);
    CHECK_EQ(stash_default_heap(0, &h), STASH_ERR_UNSUPPORTED);
    CHECK(strcmp(stash_last_error(), why) == 0);
    CHECK_STR_CONTAINS(stash_last_error(), "cuda: ");
  }

  th_current = "bad_sim_settings";
  setenv("STASH_PROVIDER", "sim", 1);
  setenv("STASH_SIM_CAPACITY", "lots", 1);
  CHECK_EQ(stash_default_heap(0, &h), STASH_ERR_CONF);
  CHECK_STR_CONTAINS(stash_last_error(), "STASH_SIM_CAPACITY");
  setenv("STASH_SIM_CAPACITY", "1GiB", 1);
  setenv("STASH_SIM_DEVICES", "0", 1);
  CHECK_EQ(stash_default_heap(0, &h), STASH_ERR_CONF);
  CHECK_STR_CONTAINS(stash_last_error(), "STASH_SIM_DEVICES");
  setenv("STASH_SIM_DEVICES", "2", 1);

  th_current = "bad_conf";
  setenv("STASH_CONF", "policy:pytorch,bogus_key:1", 1);
  CHECK_EQ(stash_default_heap(0, &h), STASH_ERR_CONF);
  CHECK_STR_CONTAINS(stash_last_error(), "bogus_key");
  CHECK(h == NULL);

  th_current = "good";
  setenv("STASH_CONF", "policy:pytorch,expandable_segments:True", 1);
  CHECK_OK(stash_default_heap(0, &h));
  if (!h) return 1;
  stash_conf_t conf;
  stash_heap_conf(h, &conf);
  CHECK(conf.expandable_segments);
  size_t fr, tot;
  CHECK_OK(stash_heap_mem_get_info(h, &fr, &tot));
  CHECK_EQ(tot, 1 * GiB); /* STASH_SIM_CAPACITY */
  stash_heap_t* h2 = NULL;
  CHECK_OK(stash_default_heap(0, &h2));
  CHECK(h2 == h); /* one heap per device */
  CHECK_EQ(stash_default_heap(2, &h2), STASH_ERR_INVALID); /* 2 devices */

  void* a = stash_malloc(1000, NULL);
  CHECK(a != NULL);
  CHECK_EQ(stash_get_device(), 0);
  CHECK_OK(stash_set_device(1));
  void* b = stash_malloc(3 * MiB, (void*)5);
  CHECK(b != NULL);
  stash_heap_t* h1 = NULL;
  CHECK_OK(stash_default_heap(1, &h1));
  CHECK(h1 != h);
  stash_stats_t s;
  s.size = sizeof s;
  CHECK_OK(stash_heap_stats(h1, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 1);
  CHECK_OK(stash_set_device(0));
  stash_free(b); /* found on device 1's heap */
  CHECK_OK(stash_heap_stats(h1, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 0);
  stash_free(a);
  stash_free(NULL);
  stash_free((void*)0x1234000);
  CHECK_STR_CONTAINS(stash_last_error(), "not a live allocation of any default heap");
  CHECK(stash_malloc(0, NULL) == NULL);
  CHECK(stash_malloc(2 * GiB, NULL) == NULL); /* more than the 1 GiB device */
  CHECK_STR_CONTAINS(stash_last_error(), "out of memory");
  CHECK_EQ(stash_set_device(-1), STASH_ERR_INVALID);

  th_current = "threads";
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, churn, NULL);
  for (int i = 0; i < 4; i++) {
    void* r;
    pthread_join(th[i], &r);
    CHECK(r == NULL);
  }
  CHECK_OK(stash_heap_stats(h, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 0);
  CHECK_OK(stash_heap_check(h));

  th_current = "plugins"; /* PyTorch's and CuPy's entry points, over the same heaps */
  setenv("STASH_TORCH_NULL_ON_FAILURE", "1", 1); /* failures return NULL instead of aborting */
  CHECK_EQ(stash_default_heap_list(NULL, 0), 2);
  stash_heap_t* list[4] = {NULL};
  CHECK_EQ(stash_default_heap_list(list, 1), 2); /* how many exist, one written */
  CHECK(list[0] == h && list[1] == NULL);
  void* t = stash_torch_malloc(5 * MiB, 1, (void*)7);
  CHECK(t != NULL);
  CHECK_OK(stash_heap_stats(h1, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 1);
  stash_torch_record_stream(t, (void*)8); /* found on device 1's heap */
  stash_torch_free(t, 5 * MiB, 1, (void*)7);
  CHECK_OK(stash_heap_stats(h1, &s));
  CHECK_EQ(s.active[STASH_STAT_ALL].current, 1); /* pending: stream 8 may use it */
  CHECK(stash_torch_malloc(-1, 0, NULL) == NULL);
  CHECK(stash_torch_malloc(100, 9, NULL) == NULL); /* no device 9 */
  CHECK_STR_CONTAINS(stash_last_error(), "device 9");
  void* c = stash_cupy_malloc(NULL, 4096, 0);
  CHECK(c != NULL);
  stash_cupy_free(NULL, c, 0);
  stash_torch_set_memory_fraction(0.5, 0);
  CHECK(stash_torch_malloc(700 * MiB, 0, NULL) == NULL); /* over half of 1 GiB */
  CHECK_STR_CONTAINS(stash_last_error(), "fraction");
  stash_torch_reset(); /* empty_cache on both heaps */
  CHECK_OK(stash_heap_stats(h, &s));
  CHECK_EQ(s.reserved_bytes[STASH_STAT_ALL].current, 0);
  CHECK(stash_torch_base_alloc((void*)0x4000, NULL) == (void*)0x4000);
  stash_torch_init(2);
  CHECK_OK(stash_heap_check(h));
  CHECK_OK(stash_heap_check(h1));

  th_current = "graph_pools"; /* CUDA graphs' private pools (torch.cuda.graph's hooks) */
  stash_torch_set_memory_fraction(1.0, 0);
  void* S = (void*)5; /* the capture's stream */
  void* before = stash_torch_malloc(64 * MiB, 0, S); /* the default heap's */
  CHECK_EQ(stash_torch_pool_list(NULL, 0), 0);
  stash_torch_begin_allocate_to_pool(0, 7, 1, NULL);
  stash_heap_t* pools[2] = {NULL};
  CHECK_EQ(stash_torch_pool_list(pools, 2), 1);
  stash_heap_t* ph = pools[0];
  CHECK(ph != NULL && ph != h && ph != h1);
  if (ph) {
    stash_heap_conf(ph, &conf); /* made like the default heap */
    CHECK(conf.expandable_segments);
  }
  void* tmp = stash_torch_malloc(64 * MiB, 0, S); /* a temporary of the captured work */
  void* out = stash_torch_malloc(4 * MiB, 0, S);  /* its output, kept by the program */
  CHECK(tmp != NULL && out != NULL && tmp != before);
  CHECK_OK(stash_heap_stats(ph, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 2);
  CHECK_OK(stash_heap_stats(h, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 1); /* `before` only */
  stash_torch_free(tmp, 64 * MiB, 0, S); /* freed within the capture: back to the pool */
  void* tmp2 = stash_torch_malloc(64 * MiB, 0, S);
  CHECK(tmp2 == tmp); /* the capture reuses its own memory */
  stash_torch_free(tmp2, 64 * MiB, 0, S);
  stash_torch_end_allocate_to_pool(0, 7, 1);
  stash_torch_free(before, 64 * MiB, 0, S);
  void* after = stash_torch_malloc(64 * MiB, 0, S); /* outside the capture */
  CHECK(after != NULL && after != tmp); /* never the memory the graph replays into */
  CHECK_OK(stash_heap_stats(h, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 1);
  CHECK_OK(stash_heap_stats(ph, &s));
  int64_t pool_reserved = s.reserved_bytes[STASH_STAT_ALL].current;
  CHECK(pool_reserved >= 68 * (int64_t)MiB);
  stash_torch_reset(); /* empty_cache: the pool keeps its free memory */
  CHECK_OK(stash_heap_stats(ph, &s));
  CHECK_EQ(s.reserved_bytes[STASH_STAT_ALL].current, pool_reserved);
  stash_torch_record_stream(out, (void*)6); /* found in the pool's heap */
  stash_torch_begin_allocate_to_pool(0, 7, 1, NULL); /* a second graph shares the pool */
  void* tmp3 = stash_torch_malloc(64 * MiB, 0, S);
  CHECK(tmp3 == tmp);
  stash_torch_free(tmp3, 64 * MiB, 0, S);
  stash_torch_end_allocate_to_pool(0, 7, 1);
  stash_torch_begin_allocate_to_pool(1, 7, 1, NULL); /* the same id on device 1: another pool */
  stash_torch_end_allocate_to_pool(1, 7, 1);
  CHECK_EQ(stash_torch_pool_list(NULL, 0), 2);
  stash_torch_release_pool(1, 7, 1);
  stash_torch_release_pool(0, 7, 1); /* one of its two graphs gone */
  stash_torch_reset();
  CHECK_EQ(stash_torch_pool_list(pools, 2), 1); /* device 1's given back; device 0's in use */
  CHECK(pools[0] == ph);
  stash_torch_release_pool(0, 7, 1); /* the second graph gone, but `out` lives */
  stash_torch_reset();
  CHECK_EQ(stash_torch_pool_list(NULL, 0), 1);
  stash_torch_free(out, 4 * MiB, 0, S); /* to the pool's heap (pending: stream 6 used it) */
  CHECK_OK(stash_heap_check(ph));
  stash_torch_reset(); /* now it goes: memory given back, heap destroyed */
  CHECK_EQ(stash_torch_pool_list(NULL, 0), 0);
  stash_torch_free(after, 64 * MiB, 0, S);
  CHECK_OK(stash_heap_stats(h, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 0);
  CHECK_OK(stash_heap_check(h));

  th_current = "graph_pools_threads";
  pthread_t tc, te;
  pthread_create(&tc, NULL, capturer, NULL);
  pthread_create(&te, NULL, eager, NULL);
  void* rc = NULL;
  pthread_join(tc, &rc);
  CHECK(rc == NULL);
  pthread_join(te, &rc);
  CHECK(rc == NULL);
  stash_torch_reset(); /* the pools the eager thread's last frees emptied */
  CHECK_EQ(stash_torch_pool_list(NULL, 0), 0);
  CHECK_OK(stash_heap_stats(h, &s));
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 0);
  CHECK_OK(stash_heap_check(h));

  stash_default_shutdown();
  /* After shutdown the heaps are made again from the environment. */
  setenv("STASH_CONF", "policy:pytorch", 1);
  CHECK_OK(stash_default_heap(0, &h));
  stash_heap_conf(h, &conf);
  CHECK(!conf.expandable_segments);
  stash_default_shutdown();
  TEST_MAIN_END();
}
