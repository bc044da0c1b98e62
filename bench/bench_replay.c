/* bench_replay: host time per allocator call on the shared traces and on same-size
 * alloc/free pairs, median of several repetitions, on the simulated device (no driver
 * time: what is measured is stash's own bookkeeping).
 *
 *   bench_replay [--reps N] [--passes P] [--conf STR]... [--no-pairs] TRACE...
 *   bench_replay --digest [--passes P] [--conf STR]... TRACE...
 *
 * For each trace and configuration: "cold" is a first pass on a fresh heap (it includes
 * creating the segments), "warm" a second pass over the same heap after the first pass's
 * blocks were freed (the cache already holds what the trace needs) - as the anchors'
 * figures for PyTorch in data/traces/README.md were taken - and "steady" the median of P
 * more passes over the same heap (default 8). A heap's own tables still grow in the warm
 * pass: policy:stash's loop detector keeps the last 64K large events (2.5 MiB), so a trace of
 * fewer touches new host pages in its second pass too, once per heap - on gpt2_train about
 * 150 page faults, a third of the warm pass's time on a VM; "steady" is what a long run pays
 * per event once they are all made (thirty-ninth session). Then pairs: the same size
 * allocated and freed 10^6 times, for 4 KiB ... 64 MiB (not with --no-pairs: a profile of the
 * traces alone).
 *
 * --digest times nothing: for each trace and configuration it makes P passes (default 3) over
 * one heap, as above, and prints a hash (64-bit FNV-1a) of every address the heap returned,
 * in order, with the peak reserved bytes and provider calls. Two builds that print the same
 * digests made the same decisions on those traces: the check a change meant only to be faster
 * needs (bench/same_decisions.sh runs it for two sources over every trace).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stash.h"
#include "stash_provider.h"
#include "trace.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One pass over the trace; returns ns per event, or -1 on error. As stash-replay does, the
 * simulated GPU keeps up: after each event the work queued on every stream is done, so that
 * the events a multi-stream trace records for cross-stream reuse complete (else memory a
 * stream freed would never serve the others, and every allocation would query an event that
 * never completes: a path no replay takes). That call is timed too (one lock, alike for every
 * configuration). With `hash` (--digest): every address the heap returns is hashed into it
 * (64-bit FNV-1a), and an allocation out of memory hashes as 0 - a decision too - instead of
 * ending the pass. */
static double pass(stash_heap_t* h, stash_sim_t* sim, const trace_t* t, void** ptrs,
                   uint64_t* hash) {
  double t0 = now_ns();
  for (size_t i = 0; i < t->nevents; i++) {
    const trace_event_t* e = &t->events[i];
    void* stream = (void*)(uintptr_t)t->streams[e->stream];
    if (e->op == TRACE_ALLOC) {
      stash_status_t st = stash_heap_alloc(h, e->size, stream, &ptrs[e->id]);
      if (st != STASH_OK && (!hash || st != STASH_ERR_OOM)) return -1;
      if (hash) {
        uint64_t a = st == STASH_OK ? (uint64_t)(uintptr_t)ptrs[e->id] : 0;
        for (int b = 0; b < 8; b++) *hash = (*hash ^ ((a >> (8 * b)) & 0xff)) * 1099511628211ull;
      }
    } else if (ptrs[e->id]) {
      stash_heap_free(h, ptrs[e->id]);
      ptrs[e->id] = NULL;
    }
    if (t->nstreams > 1) stash_sim_complete_all(sim);
  }
  double ns = (now_ns() - t0) / (double)t->nevents;
  for (uint64_t i = 0; i < t->nallocs; i++) {
    if (ptrs[i]) stash_heap_free(h, ptrs[i]);
    ptrs[i] = NULL;
  }
  return ns;
}

/* --digest: P passes over one heap; the hash of every address, in order (pass). */
static int digest(const char* path, const trace_t* t, const char* conf_text, int passes,
                  void** ptrs) {
  stash_conf_t conf;
  stash_conf_init(&conf);
  if (stash_conf_parse(&conf, conf_text) != STASH_OK) {
    fprintf(stderr, "%s\n", stash_last_error());
    return 2;
  }
  stash_sim_t* sim;
  stash_heap_t* h;
  if (stash_sim_create(1, 0, &sim) != STASH_OK ||
      stash_heap_create(&conf, stash_sim_provider(sim), 0, &h) != STASH_OK) {
    fprintf(stderr, "%s\n", stash_last_error());
    return 2;
  }
  uint64_t hash = 14695981039346656037ull;
  for (int k = 0; k < passes; k++) {
    if (pass(h, sim, t, ptrs, &hash) < 0) {
      fprintf(stderr, "%s: %s\n", path, stash_last_error());
      return 2;
    }
  }
  stash_stats_t s = {.size = sizeof s};
  stash_heap_stats(h, &s);
  printf("%s %s %016llx %llu %llu %llu\n", path, conf_text, (unsigned long long)hash,
         (unsigned long long)s.reserved_bytes[STASH_STAT_ALL].peak,
         (unsigned long long)s.num_device_alloc, (unsigned long long)s.num_device_free);
  stash_heap_destroy(h);
  stash_sim_destroy(sim);
  return 0;
}

int main(int argc, char** argv) {
  int reps = 7;
  const char* confs[16];
  int nconfs = 0;
  int first_trace = argc, pairs = 1, passes = 0, digests = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--conf") && i + 1 < argc && nconfs < 16) confs[nconfs++] = argv[++i];
    else if (!strcmp(argv[i], "--no-pairs")) pairs = 0;
    else if (!strcmp(argv[i], "--digest")) digests = 1;
    else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
    else {
      first_trace = i;
      break;
    }
  }
  if (nconfs == 0) {
    confs[nconfs++] = "policy:pytorch";
    confs[nconfs++] = "policy:pytorch,expandable_segments:True";
  }
  if (reps < 1 || reps > 101) reps = 7;
  if (passes < 1 || passes > 101) passes = digests ? 3 : 8;
  if (!digests)
    printf("%-26s %-44s %12s %12s %12s\n", "trace", "configuration", "cold ns/ev", "warm ns/ev",
           "steady ns/ev");
  for (int ti = first_trace; ti < argc; ti++) {
    trace_t t;
    char err[512];
    if (!trace_read(argv[ti], &t, err, sizeof err, NULL, NULL)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    void** ptrs = calloc(t.nallocs + 1, sizeof *ptrs);
    if (!ptrs) {
      fprintf(stderr, "out of host memory\n");
      return 1;
    }
    for (int c = 0; c < nconfs; c++) {
      if (digests) {
        if (digest(argv[ti], &t, confs[c], passes, ptrs)) return 2;
        continue;
      }
      stash_conf_t conf;
      stash_conf_init(&conf);
      if (stash_conf_parse(&conf, confs[c]) != STASH_OK) {
        fprintf(stderr, "%s\n", stash_last_error());
        return 2;
      }
      double cold[101], warm[101], steady[101], later[101];
      for (int r = 0; r < reps; r++) {
        stash_sim_t* sim;
        stash_heap_t* h;
        stash_sim_create(1, 0, &sim);
        stash_heap_create(&conf, stash_sim_provider(sim), 0, &h);
        cold[r] = pass(h, sim, &t, ptrs, NULL);
        warm[r] = pass(h, sim, &t, ptrs, NULL);
        for (int k = 0; k < passes; k++) later[k] = pass(h, sim, &t, ptrs, NULL);
        steady[r] = median(later, passes);
        stash_heap_destroy(h);
        stash_sim_destroy(sim);
      }
      printf("%-26s %-44s %12.0f %12.0f %12.0f\n", t.name, confs[c], median(cold, reps),
             median(warm, reps), median(steady, reps));
    }
    free(ptrs);
    trace_free(&t);
  }
  if (digests || !pairs) return 0;
  printf("\n%-44s %10s %16s\n", "same size alloc+free, 10^6 pairs", "size", "ns/pair (median)");
  static const size_t sizes[] = {4096, 65536, 1 << 20, 4 << 20, 64 << 20};
  for (int c = 0; c < nconfs; c++) {
    stash_conf_t conf;
    stash_conf_init(&conf);
    stash_conf_parse(&conf, confs[c]);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      stash_sim_t* sim;
      stash_heap_t* h;
      stash_sim_create(1, 0, &sim);
      stash_heap_create(&conf, stash_sim_provider(sim), 0, &h);
      double v[101];
      for (int r = 0; r < reps; r++) {
        const int n = 1000000;
        double t0 = now_ns();
        for (int i = 0; i < n; i++) {
          void* p;
          stash_heap_alloc(h, sizes[k], NULL, &p);
          stash_heap_free(h, p);
        }
        v[r] = (now_ns() - t0) / n;
      }
      printf("%-44s %10zu %16.1f\n", confs[c], sizes[k], median(v, reps));
      stash_heap_destroy(h);
      stash_sim_destroy(sim);
    }
  }
  return 0;
}
