/* stats.c: PyTorch's DeviceStats - the update rules, resets, JSON and the summary table.
 *
 * Stat.increase(n): current += n, peak = max(peak, current), allocated += n.
 * Stat.decrease(n): current -= n, freed += n.
 * The statistic names and the JSON/summary layouts are those of torch.cuda.memory_stats()
 * and torch.cuda.memory_summary(), so tools written for PyTorch read ours unchanged.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static stash_status_t check_one(const char* name, const stash_stat_t* a, const int64_t* want) {
  for (int t = STASH_STAT_SMALL; t <= STASH_STAT_LARGE; t++) {
    if (a[t].current != want[t])
      return _stash_error(STASH_ERR_INVALID,
                          "heap check: %s.%s.current is %" PRId64 ", the blocks say %" PRId64,
                          name, t == STASH_STAT_SMALL ? "small_pool" : "large_pool",
                          a[t].current, want[t]);
  }
  if (a[STASH_STAT_ALL].current != want[STASH_STAT_SMALL] + want[STASH_STAT_LARGE])
    return _stash_error(STASH_ERR_INVALID, "heap check: %s.all.current is not the sum of the pools",
                        name);
  for (int t = 0; t < STASH_STAT_NTYPES; t++) {
    if (a[t].peak < a[t].current)
      return _stash_error(STASH_ERR_INVALID, "heap check: %s peak below current", name);
  }
  return STASH_OK;
}

stash_status_t _stash_stats_check(const stash_stats_t* st, const stash_stat_counts_t* n) {
  stash_status_t r = STASH_OK;
#define STASH_X_(name, doc) \
  if (r == STASH_OK) r = check_one(#name, st->name, n->name);
  STASH_STAT_ARRAYS(STASH_X_)
#undef STASH_X_
  return r;
}

void _stash_stats_reset_peak(stash_stats_t* s) {
  for (int t = 0; t < STASH_STAT_NTYPES; t++) {
#define STASH_X_(name, doc) s->name[t].peak = s->name[t].current;
    STASH_STAT_ARRAYS(STASH_X_)
#undef STASH_X_
  }
#define STASH_X_(name, doc) s->name.peak = s->name.current;
  STASH_STAT_SINGLES(STASH_X_)
#undef STASH_X_
}

void _stash_stats_reset_accumulated(stash_stats_t* s) {
  for (int t = 0; t < STASH_STAT_NTYPES; t++) {
#define STASH_X_(name, doc) s->name[t].allocated = s->name[t].freed = 0;
    STASH_STAT_ARRAYS(STASH_X_)
#undef STASH_X_
  }
#define STASH_X_(name, doc) s->name.allocated = s->name.freed = 0;
  STASH_STAT_SINGLES(STASH_X_)
#undef STASH_X_
#define STASH_X_(name, doc) s->name = 0;
  STASH_STAT_COUNTERS(STASH_X_)
  STASH_STAT_STASH_COUNTERS(STASH_X_)
#undef STASH_X_
}

/* ---- JSON ---------------------------------------------------------------------------- */

typedef struct kv_s {
  char key[64];
  int64_t value;
} kv_t;

static int kv_cmp(const void* a, const void* b) {
  return strcmp(((const kv_t*)a)->key, ((const kv_t*)b)->key);
}

static const char* const k_types[STASH_STAT_NTYPES] = {"all", "small_pool", "large_pool"};

#define KV_MAX 256

static size_t collect(const stash_stats_t* s, kv_t* kv) {
  size_t n = 0;
  static const char* const fields[4] = {"current", "peak", "allocated", "freed"};
#define ADD_STAT(prefix, st)                                                           \
  do {                                                                                 \
    const int64_t vals_[4] = {(st).current, (st).peak, (st).allocated, (st).freed};    \
    for (int f_ = 0; f_ < 4; f_++) {                                                    \
      snprintf(kv[n].key, sizeof kv[n].key, "%s.%s", prefix, fields[f_]);              \
      kv[n++].value = vals_[f_];                                                       \
    }                                                                                  \
  } while (0)
  char prefix[48];
  for (int t = 0; t < STASH_STAT_NTYPES; t++) {
#define STASH_X_(name, doc)                                         \
  snprintf(prefix, sizeof prefix, "%s.%s", #name, k_types[t]);      \
  ADD_STAT(prefix, s->name[t]);
    STASH_STAT_ARRAYS(STASH_X_)
#undef STASH_X_
  }
#define STASH_X_(name, doc) ADD_STAT(#name, s->name);
  STASH_STAT_SINGLES(STASH_X_)
#undef STASH_X_
#define STASH_X_(name, doc)                          \
  snprintf(kv[n].key, sizeof kv[n].key, "%s", #name); \
  kv[n++].value = s->name;
  STASH_STAT_COUNTERS(STASH_X_)
  STASH_STAT_STASH_COUNTERS(STASH_X_) /* the keys are sorted below: their place is free */
#undef STASH_X_
  snprintf(kv[n].key, sizeof kv[n].key, "max_split_size");
  kv[n++].value = s->max_split_size;
#undef ADD_STAT
  qsort(kv, n, sizeof *kv, kv_cmp);
  return n;
}

size_t stash_stats_json(const stash_stats_t* stats, char* buf, size_t n) {
  /* A struct of an older version (a smaller size, stash_heap_stats filled a prefix of it):
   * the fields it lacks read as 0. A size under the first statistic's offset is taken as
   * unset: the whole struct. */
  stash_stats_t whole;
  if (stats->size >= offsetof(stash_stats_t, allocation) && stats->size < sizeof whole) {
    memset(&whole, 0, sizeof whole);
    memcpy(&whole, stats, stats->size);
    stats = &whole;
  }
  kv_t kv[KV_MAX];
  size_t count = collect(stats, kv);
  size_t len = 0;
  if (n) buf[0] = '\0';
  _stash_appendf(buf, n, &len, "{");
  for (size_t i = 0; i < count; i++) {
    _stash_appendf(buf, n, &len, "%s\"%s\": %" PRId64, i ? ", " : "", kv[i].key, kv[i].value);
  }
  _stash_appendf(buf, n, &len, "}");
  return len;
}

/* ---- memory_summary ---------------------------------------------------------------- */

static void format_size(char* out, size_t n, int64_t sz, double pref) {
  static const char* const prefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const char* prefix = prefixes[0];
  for (int i = 1; i < 6; i++) {
    if (pref < 768.0 * 1024) break;
    prefix = prefixes[i];
    sz = sz >= 0 ? sz / 1024 : -((-sz + 1023) / 1024); /* Python's floor division */
    pref /= 1024;
  }
  snprintf(out, n, "%6" PRId64 " %s", sz, prefix);
}

static void format_count(char* out, size_t n, int64_t cnt, double pref) {
  static const char* const prefixes[] = {" ", "K", "M"};
  const char* prefix = prefixes[0];
  for (int i = 1; i < 3; i++) {
    if (pref < 750.0 * 1000) break;
    prefix = prefixes[i];
    cnt = cnt >= 0 ? cnt / 1000 : -((-cnt + 999) / 1000);
    pref /= 1000;
  }
  snprintf(out, n, "%7" PRId64 " %s ", cnt, prefix);
}

typedef void (*cell_fn)(char* out, size_t n, int64_t v, double pref);

static void summary_row(char* buf, size_t n, size_t* len, const char* name, cell_fn f,
                        const stash_stat_t* st, const stash_stat_t* ref) {
  char c[4][32];
  f(c[0], sizeof c[0], st->current, (double)ref->current);
  f(c[1], sizeof c[1], st->peak, (double)ref->peak);
  f(c[2], sizeof c[2], st->allocated, (double)ref->allocated);
  f(c[3], sizeof c[3], st->freed, (double)ref->freed);
  _stash_appendf(buf, n, len, "| %-21s | %s | %s | %s | %s |\n", name, c[0], c[1], c[2], c[3]);
}

size_t stash_stats_summary(const stash_stats_t* s, int device, bool abbreviated, char* buf,
                           size_t n) {
  static const char eq[] =
      "===========================================================================";
  static const char dash[] =
      "---------------------------------------------------------------------------";
  struct metric {
    const stash_stat_t* stat;
    const char* name;
    cell_fn fn;
  } const metrics[] = {
      {s->allocated_bytes, "Allocated memory", format_size},
      {s->active_bytes, "Active memory", format_size},
      {s->requested_bytes, "Requested memory", format_size},
      {s->reserved_bytes, "GPU reserved memory", format_size},
      {s->inactive_split_bytes, "Non-releasable memory", format_size},
      {s->allocation, "Allocations", format_count},
      {s->active, "Active allocs", format_count},
      {s->segment, "GPU reserved segments", format_count},
      {s->inactive_split, "Non-releasable allocs", format_count},
  };
  size_t len = 0;
  if (n) buf[0] = '\0';
  _stash_appendf(buf, n, &len, "|%s|\n", eq);
  _stash_appendf(buf, n, &len, "| %16s stash CUDA memory summary, device ID %-19d |\n", "", device);
  _stash_appendf(buf, n, &len, "|%s|\n", dash);
  _stash_appendf(buf, n, &len,
                 "|  %9s CUDA OOMs: %-12" PRId64 " | %6s cudaMalloc retries: %-8" PRId64 "  |\n",
                 "", s->num_ooms, "", s->num_alloc_retries);
  _stash_appendf(buf, n, &len, "|%s|\n", eq);
  _stash_appendf(buf, n, &len,
                 "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n");
  for (size_t m = 0; m < sizeof metrics / sizeof metrics[0]; m++) {
    _stash_appendf(buf, n, &len, "|%s|\n", dash);
    const stash_stat_t* ref = &metrics[m].stat[STASH_STAT_ALL];
    summary_row(buf, n, &len, metrics[m].name, metrics[m].fn, ref, ref);
    if (!abbreviated) {
      summary_row(buf, n, &len, "      from large pool", metrics[m].fn,
                  &metrics[m].stat[STASH_STAT_LARGE], ref);
      summary_row(buf, n, &len, "      from small pool", metrics[m].fn,
                  &metrics[m].stat[STASH_STAT_SMALL], ref);
    }
  }
  _stash_appendf(buf, n, &len, "|%s|\n", dash);
  summary_row(buf, n, &len, "Oversize allocations", format_count, &s->oversize_allocations,
              &s->oversize_allocations);
  _stash_appendf(buf, n, &len, "|%s|\n", dash);
  summary_row(buf, n, &len, "Oversize GPU segments", format_count, &s->oversize_segments,
              &s->oversize_segments);
  _stash_appendf(buf, n, &len, "|%s|\n", eq);
  return len;
}
