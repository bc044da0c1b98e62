/* fixture.h: a heap on a fresh simulated device, for the tests.
 *
 *   fixture_t f; fx_open(&f, "policy:pytorch,...", capacity);
 *   void* p = fx_alloc(&f, size, stream);   (CHECKs success)
 *   ... fx_close(&f);   checks the heap's invariants, destroys it, and checks that the
 *                       simulated device holds nothing afterwards (no leak)
 */
#ifndef STASH_FIXTURE_H
#define STASH_FIXTURE_H

#include "stash.h"
#include "stash_provider.h"
#include "testhelper.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)
#define GiB ((size_t)1 << 30)

typedef struct fixture_s {
  stash_sim_t* sim;
  stash_heap_t* heap;
} fixture_t;

static inline int fx_open(fixture_t* f, const char* conf_text, size_t capacity) {
  stash_conf_t conf;
  stash_conf_init(&conf);
  f->sim = NULL;
  f->heap = NULL;
  if (stash_conf_parse(&conf, conf_text) != STASH_OK) {
    fprintf(stderr, "[%s] bad test configuration '%s': %s\n", th_current, conf_text,
            stash_last_error());
    th_failures++;
    return 0;
  }
  CHECK_OK(stash_sim_create(1, capacity, &f->sim));
  if (!f->sim) return 0;
  CHECK_OK(stash_heap_create(&conf, stash_sim_provider(f->sim), 0, &f->heap));
  return f->heap != NULL;
}

static inline stash_stats_t fx_stats(fixture_t* f) {
  stash_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  stash_heap_stats(f->heap, &s);
  return s;
}

static inline void* fx_alloc(fixture_t* f, size_t size, void* stream) {
  void* p = NULL;
  stash_status_t st = stash_heap_alloc(f->heap, size, stream, &p);
  if (st != STASH_OK) {
    th_failures++;
    fprintf(stderr, "[%s] alloc(%zu) failed: %s\n", th_current, size, stash_last_error());
  }
  return p;
}

static inline void fx_free(fixture_t* f, void* p) { CHECK_OK(stash_heap_free(f->heap, p)); }

static inline void fx_close(fixture_t* f) {
  if (f->heap) {
    CHECK_OK(stash_heap_check(f->heap));
    CHECK_OK(stash_heap_destroy(f->heap));
  }
  if (f->sim) {
    stash_sim_usage_t u;
    stash_sim_usage(f->sim, 0, &u);
    CHECK_EQ(u.used_bytes, 0);
    CHECK_EQ(u.allocations, 0);
    CHECK_EQ(u.reservations, 0);
    CHECK_EQ(u.handles, 0);
    CHECK_EQ(u.mapped_pages, 0);
    CHECK_EQ(u.events, 0);
    stash_sim_destroy(f->sim);
  }
  f->sim = NULL;
  f->heap = NULL;
}

#define STAT(f, name, pool, field) (fx_stats(f).name[STASH_STAT_##pool].field)

/* A stash_sim_call_fn that tallies what it is told: calls and bytes by kind, and microseconds
 * (stash_sim_on_call; tools/timed_provider.c's hook). */
typedef struct fx_told_s {
  uint64_t n[STASH_CALL_COUNT];
  uint64_t bytes[STASH_CALL_COUNT];
  double us;
} fx_told_t;

static inline void fx_tell(void* arg, stash_provider_call_t call, uint64_t bytes, double us) {
  fx_told_t* t = (fx_told_t*)arg;
  t->n[call]++;
  t->bytes[call] += bytes;
  t->us += us;
}

#endif
