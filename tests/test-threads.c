/* test-threads: 8 threads allocate, free (also each other's blocks), record streams,
 * empty the cache and read statistics on one heap at once. Run under ThreadSanitizer in CI
 * (the tsan build); here it checks that no address is ever handed out twice and that the
 * heap is consistent at the end.
 *
 *   test-threads [ITERATIONS_PER_THREAD]   (default 20000; STASH_STRESS_ITERS overrides)
 */
#include <pthread.h>
#include <sched.h>

#include "fixture.h"

#define NTHREADS 8
#define SLOTS 64
#define MAX_LIVE 4096

static stash_heap_t* g_heap;
static stash_sim_t* g_sim;
static int g_iters = 20000;

/* Every live allocation, to catch the same address handed out twice. */
static pthread_mutex_t g_live_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t g_live[MAX_LIVE];
static size_t g_live_size[MAX_LIVE];
static int g_errors;

/* A mailbox per thread: blocks other threads hand over to be freed. */
static pthread_mutex_t g_box_lock = PTHREAD_MUTEX_INITIALIZER;
static void* g_box[NTHREADS][SLOTS];

static void live_add(void* p, size_t size) {
  pthread_mutex_lock(&g_live_lock);
  int free_slot = -1;
  for (int i = 0; i < MAX_LIVE; i++) {
    uintptr_t q = g_live[i];
    if (!q) {
      if (free_slot < 0) free_slot = i;
      continue;
    }
    if ((uintptr_t)p < q + g_live_size[i] && q < (uintptr_t)p + size) {
      g_errors++;
      fprintf(stderr, "overlap: %p+%zu and 0x%lx+%zu\n", p, size, (unsigned long)q, g_live_size[i]);
    }
  }
  if (free_slot >= 0) {
    g_live[free_slot] = (uintptr_t)p;
    g_live_size[free_slot] = size;
  } else {
    g_errors++;
  }
  pthread_mutex_unlock(&g_live_lock);
}

static void live_remove(void* p) {
  pthread_mutex_lock(&g_live_lock);
  for (int i = 0; i < MAX_LIVE; i++) {
    if (g_live[i] == (uintptr_t)p) {
      g_live[i] = 0;
      break;
    }
  }
  pthread_mutex_unlock(&g_live_lock);
}

static void release(void* p) {
  live_remove(p); /* before the free: once freed, another thread may get it */
  if (stash_heap_free(g_heap, p) != STASH_OK) {
    __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    fprintf(stderr, "free failed: %s\n", stash_last_error());
  }
}

static void* worker(void* arg) {
  int id = (int)(intptr_t)arg;
  uint64_t rng = 0x9E3779B97F4A7C15ULL * (uint64_t)(id + 1);
  void* mine[SLOTS] = {0};
  void* stream = (void*)(uintptr_t)(0x100 + id % 3); /* 3 streams shared by 8 threads */
  for (int it = 0; it < g_iters; it++) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    int slot = (int)(rng % SLOTS);
    int action = (int)((rng >> 8) % 100);
    if (action < 2) {
      if (stash_heap_empty_cache(g_heap) != STASH_OK) __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    } else if (action < 4) {
      stash_stats_t s;
      s.size = sizeof s;
      stash_heap_stats(g_heap, &s);
      if (s.allocation[0].current < 0) __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
      stash_sim_complete(g_sim, (void*)(uintptr_t)(0x100 + (rng >> 20) % 3));
    } else if (mine[slot]) {
      if (action < 20) {
        stash_heap_record_stream(g_heap, mine[slot], (void*)(uintptr_t)(0x100 + (rng >> 24) % 3));
        continue; /* still mine */
      } else if (action < 35) {
        /* hand it to another thread, which frees it */
        int to = (int)((rng >> 30) % NTHREADS);
        pthread_mutex_lock(&g_box_lock);
        void* prev = g_box[to][slot];
        g_box[to][slot] = mine[slot];
        pthread_mutex_unlock(&g_box_lock);
        if (prev) release(prev);
      } else {
        release(mine[slot]);
      }
      mine[slot] = NULL;
    } else {
      size_t size = (rng >> 33) % 4 == 0 ? (size_t)((rng >> 12) % (24 * MiB)) + 1
                                          : (size_t)((rng >> 12) % (64 * KiB)) + 1;
      if ((rng >> 40) % 100 == 0) size = 256 * MiB + (size_t)((rng >> 12) % (128 * MiB)); /* may be stitched */
      void* p = NULL;
      stash_status_t st = stash_heap_alloc(g_heap, size, stream, &p);
      if (st == STASH_OK) {
        live_add(p, size);
        mine[slot] = p;
      } else if (st != STASH_ERR_OOM) {
        __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
        fprintf(stderr, "alloc failed: %s\n", stash_last_error());
      }
    }
    /* empty my mailbox now and then */
    if (it % 64 == 0) {
      for (int k = 0; k < SLOTS; k++) {
        pthread_mutex_lock(&g_box_lock);
        void* q = g_box[id][k];
        g_box[id][k] = NULL;
        pthread_mutex_unlock(&g_box_lock);
        if (q) release(q);
      }
    }
  }
  for (int k = 0; k < SLOTS; k++) {
    if (mine[k]) release(mine[k]);
  }
  return NULL;
}

static void stress(const char* conf_text) {
  fixture_t f;
  if (!fx_open(&f, conf_text, 2 * GiB)) return; /* small enough to hit OOM paths */
  g_heap = f.heap;
  g_sim = f.sim;
  memset(g_live, 0, sizeof g_live); /* addresses repeat from heap to heap */
  g_errors = 0;
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, worker, (void*)(intptr_t)i);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  for (int t = 0; t < NTHREADS; t++) {
    for (int k = 0; k < SLOTS; k++) {
      if (g_box[t][k]) release(g_box[t][k]);
      g_box[t][k] = NULL;
    }
  }
  CHECK_EQ(g_errors, 0);
  stash_stats_t s = fx_stats(&f);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 0);
  CHECK(s.allocation[STASH_STAT_ALL].allocated > g_iters); /* the threads really ran */
  for (int i = 0; i < 3; i++) stash_sim_complete(f.sim, (void*)(uintptr_t)(0x100 + i));
  CHECK_OK(stash_heap_empty_cache(f.heap));
  CHECK_EQ(fx_stats(&f).reserved_bytes[STASH_STAT_ALL].current, 0);
  fx_close(&f);
}

/* stash_heap_accounts reads both pools from one view while another thread allocates: that
 * thread takes a small block X, then a large block Y, frees Y, then X, over and over, so live
 * bytes are always 0, X or X + Y - never Y alone. Two stash_heap_account calls (small pool,
 * then large) see two moments, and do see Y alone: X freed before the first, Y allocated again
 * before the second (the same loop with two calls: 16 to 185 torn views of 20000, in each of
 * six runs here). */
#define ACCT_X ((size_t)4096)
#define ACCT_Y ((size_t)8 << 20)
static _Atomic int g_acct_stop;

static void* acct_churn(void* arg) {
  (void)arg;
  while (!g_acct_stop) {
    void *x = NULL, *y = NULL;
    if (stash_heap_alloc(g_heap, ACCT_X, NULL, &x) != STASH_OK) break;
    if (stash_heap_alloc(g_heap, ACCT_Y, NULL, &y) == STASH_OK) stash_heap_free(g_heap, y);
    stash_heap_free(g_heap, x);
  }
  return NULL;
}

static void accounts_one_view(const char* conf) {
  fixture_t f;
  if (!fx_open(&f, conf, 1ull << 30)) return;
  g_heap = f.heap;
  g_acct_stop = 0;
  pthread_t t;
  CHECK(pthread_create(&t, NULL, acct_churn, NULL) == 0);
  int torn = 0, seen[3] = {0};
  for (int i = 0; i < g_iters; i++) {
    stash_account_t sm, lg;
    CHECK_OK(stash_heap_accounts(f.heap, &sm, &lg));
    uint64_t live = sm.live + lg.live;
    if (live != 0 && live != ACCT_X && live != ACCT_X + ACCT_Y) torn++;
    seen[live == 0 ? 0 : live == ACCT_X ? 1 : 2]++;
    sched_yield(); /* let the other thread run between readings */
  }
  g_acct_stop = 1;
  pthread_join(t, NULL);
  CHECK_EQ(torn, 0);
  if (getenv("STASH_ACCOUNTS_VERBOSE"))
    fprintf(stderr, "%s: live 0 / X / X+Y (or torn) in %d / %d / %d of %d views\n", conf,
            seen[0], seen[1], seen[2], g_iters);
  fx_close(&f);
}

TEST(accounts_are_one_view_under_churn) {
  accounts_one_view("policy:stash");
  accounts_one_view("policy:pytorch");
}

TEST(eight_threads_stash) { stress("policy:stash"); }
TEST(eight_threads_plain) { stress("policy:pytorch"); }
TEST(eight_threads_expandable) { stress("policy:pytorch,expandable_segments:True"); }

int main(int argc, char** argv) {
  const char* env = getenv("STASH_STRESS_ITERS");
  if (argc > 1) g_iters = atoi(argv[1]);
  else if (env) g_iters = atoi(env);
  RUN(eight_threads_stash);
  RUN(eight_threads_plain);
  RUN(eight_threads_expandable);
  RUN(accounts_are_one_view_under_churn);
  TEST_MAIN_END();
}
