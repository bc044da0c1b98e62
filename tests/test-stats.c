/* test-stats: stash_stats_json (the keys of torch.cuda.memory_stats()), stash_stats_summary
 * (the table of torch.cuda.memory_summary()), and a heap's stats / reset functions. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stash.h"
#include "internal.h"
#include "stash_provider.h"
#include "testhelper.h"

#define KiB ((int64_t)1 << 10)
#define MiB ((int64_t)1 << 20)
#define GiB ((int64_t)1 << 30)
#define TiB ((int64_t)1 << 40)
#define PiB ((int64_t)1 << 50)

/* The names, written out here rather than taken from stash_stats.h's X-macros. */
static const char* const k_arrays[9] = {
    "allocation",      "segment",        "active",       "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
    "requested_bytes"};
static const char* const k_pools[3] = {"all", "small_pool", "large_pool"};
static const int k_pool_index[3] = {STASH_STAT_ALL, STASH_STAT_SMALL, STASH_STAT_LARGE};
static const char* const k_fields[4] = {"current", "peak", "allocated", "freed"};
static const char* const k_counters[6] = {"num_alloc_retries", "num_ooms",
                                          "num_sync_all_streams", "num_device_alloc",
                                          "num_device_free", "num_stream_waits"};

static stash_stat_t* array_of(stash_stats_t* s, int a) {
  stash_stat_t* const arrs[9] = {s->allocation,      s->segment,        s->active,
                                 s->inactive_split,  s->allocated_bytes, s->reserved_bytes,
                                 s->active_bytes,    s->inactive_split_bytes,
                                 s->requested_bytes};
  return arrs[a];
}
static int64_t* counter_of(stash_stats_t* s, int c) {
  int64_t* const cs[6] = {&s->num_alloc_retries, &s->num_ooms, &s->num_sync_all_streams,
                          &s->num_device_alloc, &s->num_device_free, &s->num_stream_waits};
  return cs[c];
}
static int64_t* field_of(stash_stat_t* st, int f) {
  int64_t* const fs[4] = {&st->current, &st->peak, &st->allocated, &st->freed};
  return fs[f];
}

static void stats_init(stash_stats_t* s) {
  memset(s, 0, sizeof *s);
  s->size = sizeof *s;
  s->version = STASH_STATS_VERSION;
}

/* ---- a tiny JSON reader for {"key": integer, ...} -------------------------------------- */

#define MAX_KEYS 256
typedef struct kv_s {
  char key[80];
  int64_t value;
} kv_t;

static const char* skip_ws(const char* p) {
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
  return p;
}

/* Returns the number of pairs, or -1 (with a message) if text is not one flat object of
 * string keys and integer values. */
static int parse_json(const char* text, kv_t* kv) {
  const char* p = skip_ws(text);
  int n = 0;
  if (*p++ != '{') return fprintf(stderr, "json: no '{'\n"), -1;
  p = skip_ws(p);
  if (*p == '}') return skip_ws(p + 1)[0] ? -1 : 0;
  for (;;) {
    if (n == MAX_KEYS) return fprintf(stderr, "json: too many keys\n"), -1;
    p = skip_ws(p);
    if (*p++ != '"') return fprintf(stderr, "json: key %d has no '\"'\n", n), -1;
    size_t k = 0;
    while (*p && *p != '"') {
      if (*p == '\\' || k + 1 >= sizeof kv[n].key) return -1;
      kv[n].key[k++] = *p++;
    }
    kv[n].key[k] = '\0';
    if (*p++ != '"') return fprintf(stderr, "json: unterminated key\n"), -1;
    p = skip_ws(p);
    if (*p++ != ':') return fprintf(stderr, "json: no ':' after %s\n", kv[n].key), -1;
    p = skip_ws(p);
    char* end;
    if (!(*p == '-' || (*p >= '0' && *p <= '9')))
      return fprintf(stderr, "json: %s has no integer value\n", kv[n].key), -1;
    kv[n].value = strtoll(p, &end, 10);
    if (end == p) return -1;
    p = skip_ws(end);
    n++;
    if (*p == ',') {
      p++;
      continue;
    }
    if (*p == '}') {
      p = skip_ws(p + 1);
      if (*p) return fprintf(stderr, "json: text after the object: %s\n", p), -1;
      return n;
    }
    return fprintf(stderr, "json: unexpected '%c'\n", *p), -1;
  }
}

static const kv_t* find_key(const kv_t* kv, int n, const char* key) {
  for (int i = 0; i < n; i++)
    if (strcmp(kv[i].key, key) == 0) return &kv[i];
  return NULL;
}

/* Distinct values for every statistic; some negative, some past 32 bits. */
static void fill_distinct(stash_stats_t* s) {
  stats_init(s);
  for (int a = 0; a < 9; a++)
    for (int p = 0; p < 3; p++)
      for (int f = 0; f < 4; f++)
        *field_of(&array_of(s, a)[k_pool_index[p]], f) =
            (int64_t)(a + 1) * 1000000000000LL + (p + 1) * 1000 + (f + 1);
  for (int f = 0; f < 4; f++) {
    *field_of(&s->oversize_allocations, f) = 7000000 + f;
    *field_of(&s->oversize_segments, f) = 8000000 + f;
  }
  for (int c = 0; c < 6; c++) *counter_of(s, c) = 900 + c;
  s->requested_bytes[STASH_STAT_SMALL].freed = -5; /* the sign must survive */
  s->num_ooms = INT64_MAX;
  s->max_split_size = -1; /* SIZE_MAX as int64, as PyTorch reports "unlimited" */
}

TEST(json_keys_and_values) {
  stash_stats_t s;
  fill_distinct(&s);
  static char buf[65536];
  size_t len = stash_stats_json(&s, buf, sizeof buf);
  CHECK_EQ(len, strlen(buf));
  static kv_t kv[MAX_KEYS];
  int n = parse_json(buf, kv);
  CHECK(n >= 0);
  if (n < 0) {
    fprintf(stderr, "  ^ not a flat JSON object: %.300s\n", buf);
    return;
  }
  /* exactly the keys of torch.cuda.memory_stats(), 9*3*4 + 2*4 + 5 + 1 of them, and stash's
   * own counter num_stream_waits */
  CHECK_EQ(n, 9 * 3 * 4 + 2 * 4 + 5 + 1 + 1);
  /* sorted by strcmp (as memory_stats' OrderedDict of sorted keys), no duplicates */
  for (int i = 1; i < n; i++) {
    if (!(strcmp(kv[i - 1].key, kv[i].key) < 0)) {
      th_failures++;
      fprintf(stderr, "keys out of order: \"%s\" then \"%s\"\n", kv[i - 1].key, kv[i].key);
    }
  }
  int expected = 0;
  char key[96];
#define EXPECT_KEY(k, v)                                                                   \
  do {                                                                                     \
    expected++;                                                                            \
    const kv_t* e_ = find_key(kv, n, (k));                                                 \
    if (!e_) {                                                                             \
      th_failures++;                                                                       \
      fprintf(stderr, "json: key \"%s\" missing\n", (k));                                  \
    } else if (e_->value != (v)) {                                                         \
      th_failures++;                                                                       \
      fprintf(stderr, "json: \"%s\" is %" PRId64 ", want %" PRId64 "\n", (k), e_->value,   \
              (int64_t)(v));                                                               \
    }                                                                                      \
  } while (0)
  for (int a = 0; a < 9; a++)
    for (int p = 0; p < 3; p++)
      for (int f = 0; f < 4; f++) {
        snprintf(key, sizeof key, "%s.%s.%s", k_arrays[a], k_pools[p], k_fields[f]);
        EXPECT_KEY(key, *field_of(&array_of(&s, a)[k_pool_index[p]], f));
      }
  for (int f = 0; f < 4; f++) {
    snprintf(key, sizeof key, "oversize_allocations.%s", k_fields[f]);
    EXPECT_KEY(key, *field_of(&s.oversize_allocations, f));
    snprintf(key, sizeof key, "oversize_segments.%s", k_fields[f]);
    EXPECT_KEY(key, *field_of(&s.oversize_segments, f));
  }
  for (int c = 0; c < 6; c++) EXPECT_KEY(k_counters[c], *counter_of(&s, c));
  EXPECT_KEY("max_split_size", -1);
  CHECK_EQ(expected, n); /* so no key beyond these */
  /* spot checks of the mapping, written out */
  EXPECT_KEY("allocation.all.current", 1000000000000LL + 1001);
  EXPECT_KEY("requested_bytes.large_pool.freed", 9000000000000LL + 3004);
  EXPECT_KEY("requested_bytes.small_pool.freed", -5);
  EXPECT_KEY("inactive_split_bytes.small_pool.peak", 8000000000000LL + 2002);
  EXPECT_KEY("num_ooms", INT64_MAX);
  EXPECT_KEY("num_device_free", 904);
  EXPECT_KEY("num_stream_waits", 905);
#undef EXPECT_KEY
}

/* A struct of version 1's size (before num_stream_waits), as a caller built against that
 * header has: its JSON reads no byte past its size, and the fields it lacks are 0. Without
 * the size check the bytes past it (0x7f...) would be read as num_stream_waits. */
TEST(json_of_a_version_1_struct) {
  static unsigned char raw[sizeof(stash_stats_t) + 64];
  memset(raw, 0x7f, sizeof raw);
  stash_stats_t full;
  fill_distinct(&full);
  const size_t v1 = offsetof(stash_stats_t, num_stream_waits);
  memcpy(raw, &full, v1);
  ((stash_stats_t*)(void*)raw)->size = (uint32_t)v1;
  static char a[65536], b[65536];
  size_t la = stash_stats_json((const stash_stats_t*)(const void*)raw, a, sizeof a);
  full.num_stream_waits = 0;
  size_t lb = stash_stats_json(&full, b, sizeof b);
  CHECK_EQ(la, lb);
  CHECK(strcmp(a, b) == 0);
  CHECK(strstr(a, "\"num_stream_waits\": 0") != NULL);
  CHECK(strstr(a, "\"num_device_free\": 904") != NULL);
}

TEST(json_truncation) {
  stash_stats_t s;
  fill_distinct(&s);
  static char full[65536];
  size_t len = stash_stats_json(&s, full, sizeof full);
  CHECK_EQ(len, strlen(full));
  CHECK(len > 1000);
  CHECK_EQ(stash_stats_json(&s, NULL, 0), len);
  static const size_t sizes[] = {1, 2, 20, 333, 4096};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    char buf[5000];
    memset(buf, 'X', sizeof buf);
    CHECK_EQ(stash_stats_json(&s, buf, n), len);
    CHECK_EQ(strlen(buf), n - 1);
    CHECK(strncmp(buf, full, n - 1) == 0);
    CHECK(buf[n] == 'X');
  }
  char exact[8192];
  CHECK(len + 1 <= sizeof exact);
  if (len + 1 <= sizeof exact) {
    CHECK_EQ(stash_stats_json(&s, exact, len + 1), len);
    CHECK(strcmp(exact, full) == 0);
    CHECK_EQ(stash_stats_json(&s, exact, len), len); /* one short: loses the '}' */
    CHECK_EQ(strlen(exact), len - 1);
  }
}

/* ---- the summary table ------------------------------------------------------------------- */

/* The stats behind k_summary3. Cells: size f"{sz:6d} {prefix}", moving to the next of
 * B/KiB/MiB/GiB/TiB/PiB (sz //= 1024) while the all-row's value of that column is
 * >= 768 KiB; count f"{cnt:7d} {prefix} ", prefixes " ", K, M, threshold 750000. */
static void summary_stats(stash_stats_t* s) {
  stats_init(s);
  s->num_ooms = 42;
  s->num_alloc_retries = 7;
  /* allocated_bytes: 1536 B; 5 GiB -> 5120 MiB (GiB only from 768 GiB); 800 GiB; 768 KiB */
  s->allocated_bytes[STASH_STAT_ALL] = (stash_stat_t){1536, 5 * GiB, 800 * GiB, 768 * KiB};
  /* pool rows take the unit of the all row: 3 GiB in MiB, 3 GiB in GiB, 786431 in KiB */
  s->allocated_bytes[STASH_STAT_LARGE] = (stash_stat_t){1024, 3 * GiB, 3 * GiB, 786431};
  s->allocated_bytes[STASH_STAT_SMALL] = (stash_stat_t){512, 1536, 1 * GiB, 1};
  /* 786431 stays in bytes (6 digits), 786432 is 768 KiB */
  s->active_bytes[STASH_STAT_ALL] = (stash_stat_t){786431, 786432, 0, 0};
  /* floor division, as Python's //: -1 B is -1 KiB and -1 MiB */
  s->requested_bytes[STASH_STAT_ALL] = (stash_stat_t){1000, 2000, 3000, 5 * GiB};
  s->requested_bytes[STASH_STAT_SMALL] = (stash_stat_t){0, 0, 0, -1};
  /* PiB is the last unit: 2^62 bytes is 4096 PiB */
  s->reserved_bytes[STASH_STAT_ALL] =
      (stash_stat_t){1000 * PiB, 768 * TiB, (int64_t)1 << 62, 2 * GiB};
  s->reserved_bytes[STASH_STAT_LARGE] = s->reserved_bytes[STASH_STAT_ALL];
  /* counts: 749999 stays, 750000 is 750 K, 2.5e9 is 2500 M */
  s->allocation[STASH_STAT_ALL] = (stash_stat_t){5, 749999, 750000, 2500000000LL};
  s->allocation[STASH_STAT_LARGE] = (stash_stat_t){3, 700000, 1000, 2000000000LL};
  s->allocation[STASH_STAT_SMALL] = (stash_stat_t){2, 49999, 749000, 500000000LL};
  s->segment[STASH_STAT_ALL] = (stash_stat_t){1, 0, 0, 0};
  s->oversize_allocations = (stash_stat_t){1, 2, 750000, 3};
  s->oversize_segments = (stash_stat_t){0, 7, 0, 0};
}

static const char k_summary3[] =
    "|===========================================================================|\n"
    "|                  stash CUDA memory summary, device ID 3                   |\n"
    "|---------------------------------------------------------------------------|\n"
    "|            CUDA OOMs: 42           |        cudaMalloc retries: 7         |\n"
    "|===========================================================================|\n"
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocated memory      |   1536 B   |   5120 MiB |    800 GiB |    768 KiB |\n"
    "|       from large pool |   1024 B   |   3072 MiB |      3 GiB |    767 KiB |\n"
    "|       from small pool |    512 B   |      0 MiB |      1 GiB |      0 KiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active memory         | 786431 B   |    768 KiB |      0 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 KiB |      0 B   |      0 B   |\n"
    "|       from small pool |      0 B   |      0 KiB |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Requested memory      |   1000 B   |   2000 B   |   3000 B   |   5120 MiB |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 MiB |\n"
    "|       from small pool |      0 B   |      0 B   |      0 B   |     -1 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved memory   |   1000 PiB |    768 TiB |   4096 PiB |   2048 MiB |\n"
    "|       from large pool |   1000 PiB |    768 TiB |   4096 PiB |   2048 MiB |\n"
    "|       from small pool |      0 PiB |      0 TiB |      0 PiB |      0 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable memory |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocations           |       5    |  749999    |     750 K  |    2500 M  |\n"
    "|       from large pool |       3    |  700000    |       1 K  |    2000 M  |\n"
    "|       from small pool |       2    |   49999    |     749 K  |     500 M  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active allocs         |       0    |       0    |       0    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved segments |       1    |       0    |       0    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable allocs |       0    |       0    |       0    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize allocations  |       1    |       2    |     750 K  |       3    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize GPU segments |       0    |       7    |       0    |       0    |\n"
    "|===========================================================================|\n";

/* Every line is "|" + 75 characters + "|" + "\n"; returns the number of lines. */
static int check_lines_77(const char* text) {
  int lines = 0;
  const char* p = text;
  while (*p) {
    const char* nl = strchr(p, '\n');
    CHECK(nl != NULL);
    if (!nl) break;
    size_t w = (size_t)(nl - p);
    if (w != 77 || p[0] != '|' || p[76] != '|') {
      th_failures++;
      fprintf(stderr, "summary line %d is %zu chars (want 77, '|' at both ends): %.*s\n",
              lines + 1, w, (int)w, p);
    }
    lines++;
    p = nl + 1;
  }
  return lines;
}

/* Compare line by line, reporting the first differing lines. */
static void check_text_equal(const char* got, const char* want) {
  if (strcmp(got, want) == 0) return;
  th_failures++;
  const char *g = got, *w = want;
  int line = 1, shown = 0;
  while ((*g || *w) && shown < 8) {
    const char* gn = strchr(g, '\n');
    const char* wn = strchr(w, '\n');
    size_t gl = gn ? (size_t)(gn - g) : strlen(g), wl = wn ? (size_t)(wn - w) : strlen(w);
    if (gl != wl || strncmp(g, w, gl) != 0) {
      fprintf(stderr, "summary line %d:\n  got  '%.*s'\n  want '%.*s'\n", line, (int)gl, g,
              (int)wl, w);
      shown++;
    }
    g = gn ? gn + 1 : g + gl;
    w = wn ? wn + 1 : w + wl;
    line++;
  }
}

TEST(summary_exact_text) {
  CHECK_EQ(check_lines_77(k_summary3), 47); /* the expectation itself is well formed */
  stash_stats_t s;
  summary_stats(&s);
  static char buf[16384];
  size_t len = stash_stats_summary(&s, 3, false, buf, sizeof buf);
  CHECK_EQ(len, strlen(buf));
  CHECK_EQ(len, strlen(k_summary3));
  check_text_equal(buf, k_summary3);
  CHECK_EQ(check_lines_77(buf), 47);
}

TEST(summary_abbreviated_drops_pool_rows) {
  stash_stats_t s;
  summary_stats(&s);
  /* the expected text: k_summary3 without its "from ... pool" lines */
  static char want[16384];
  size_t wn = 0;
  int dropped = 0;
  for (const char* p = k_summary3; *p;) {
    const char* nl = strchr(p, '\n');
    size_t l = (size_t)(nl - p) + 1;
    if (strncmp(p, "|       from ", 13) == 0) {
      dropped++;
    } else {
      memcpy(want + wn, p, l);
      wn += l;
    }
    p += l;
  }
  want[wn] = '\0';
  CHECK_EQ(dropped, 18);
  static char buf[16384];
  size_t len = stash_stats_summary(&s, 3, true, buf, sizeof buf);
  CHECK_EQ(len, strlen(buf));
  check_text_equal(buf, want);
  CHECK_EQ(check_lines_77(buf), 29);
  CHECK(strstr(buf, "from large pool") == NULL);
  CHECK(strstr(buf, "from small pool") == NULL);
  CHECK(strstr(buf, "| Allocated memory      |   1536 B   |   5120 MiB |    800 GiB |    768 KiB |\n") != NULL);
}

TEST(summary_title_and_zero_stats) {
  stash_stats_t s;
  stats_init(&s);
  static char buf[16384];
  stash_stats_summary(&s, 12, false, buf, sizeof buf);
  CHECK_EQ(check_lines_77(buf), 47);
  CHECK_STR_CONTAINS(buf,
      "|                  stash CUDA memory summary, device ID 12                  |\n");
  CHECK_STR_CONTAINS(buf,
      "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |\n");
  CHECK_STR_CONTAINS(buf,
      "| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n"
      "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
      "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n");
  CHECK_STR_CONTAINS(buf,
      "| Allocations           |       0    |       0    |       0    |       0    |\n");
  /* the first line is the '=' rule, the table ends with one */
  CHECK(strncmp(buf, "|====", 5) == 0);
  size_t len = strlen(buf);
  CHECK(len > 80 && strcmp(buf + len - 78,
                           "|===========================================================================|\n") == 0);
  /* a 1-MiB-ish row with its pools, as a real heap would report it */
  s.reserved_bytes[STASH_STAT_ALL] = (stash_stat_t){22 * MiB, 22 * MiB, 22 * MiB, 0};
  s.reserved_bytes[STASH_STAT_LARGE] = (stash_stat_t){20 * MiB, 20 * MiB, 20 * MiB, 0};
  s.reserved_bytes[STASH_STAT_SMALL] = (stash_stat_t){2 * MiB, 2 * MiB, 2 * MiB, 0};
  stash_stats_summary(&s, 0, false, buf, sizeof buf);
  CHECK_STR_CONTAINS(buf,
      "| GPU reserved memory   |  22528 KiB |  22528 KiB |  22528 KiB |      0 B   |\n"
      "|       from large pool |  20480 KiB |  20480 KiB |  20480 KiB |      0 B   |\n"
      "|       from small pool |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |\n");
}

TEST(summary_truncation) {
  stash_stats_t s;
  summary_stats(&s);
  size_t len = strlen(k_summary3);
  CHECK_EQ(stash_stats_summary(&s, 3, false, NULL, 0), len);
  static const size_t sizes[] = {1, 2, 77, 78, 79, 500, 3000};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    static char buf[4096];
    memset(buf, 'X', sizeof buf);
    CHECK_EQ(stash_stats_summary(&s, 3, false, buf, n), len);
    CHECK_EQ(strlen(buf), n - 1);
    CHECK(strncmp(buf, k_summary3, n - 1) == 0);
    CHECK(buf[n] == 'X');
  }
}

/* ---- a real heap --------------------------------------------------------------------------- */

static void stats_of(stash_heap_t* h, stash_stats_t* s) {
  memset(s, 0, sizeof *s);
  s->size = sizeof *s;
  CHECK_OK(stash_heap_stats(h, s));
  CHECK_EQ(s->size, sizeof *s);
  CHECK_EQ(s->version, STASH_STATS_VERSION);
}

static stash_stat_t* single_of(stash_stats_t* s, int k) {
  return k == 0 ? &s->oversize_allocations : &s->oversize_segments;
}

TEST(heap_stats_and_resets) {
  stash_sim_t* sim = NULL;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  if (!sim) return;
  /* max_split_size 20 MiB: the 25 and 30 MiB blocks are oversize, so that the oversize
   * statistics move too */
  stash_conf_t conf;
  stash_conf_init(&conf);
  CHECK_OK(stash_conf_parse(&conf, "policy:pytorch,max_split_size_mb:20"));
  stash_heap_t* h = NULL;
  CHECK_OK(stash_heap_create(&conf, stash_sim_provider(sim), 0, &h));
  if (!h) {
    stash_sim_destroy(sim);
    return;
  }
  void* stream = NULL;
  void *small = NULL, *mid = NULL, *big = NULL, *big2 = NULL, *extra = NULL;
  CHECK_OK(stash_heap_alloc(h, 1000, stream, &small));     /* small pool */
  CHECK_OK(stash_heap_alloc(h, 3 * MiB, stream, &mid));    /* large pool, 20 MiB segment */
  CHECK_OK(stash_heap_alloc(h, 30 * MiB, stream, &big));   /* large pool, oversize */
  CHECK_OK(stash_heap_alloc(h, 25 * MiB, stream, &big2));  /* large pool, oversize */
  CHECK_OK(stash_heap_free(h, small));
  CHECK_OK(stash_heap_free(h, mid));
  CHECK_OK(stash_heap_free(h, big2));
  CHECK_OK(stash_heap_check(h));

  stash_stats_t s;
  stats_of(h, &s);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 1);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].peak, 4);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].allocated, 4);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].freed, 3);
  CHECK_EQ(s.allocation[STASH_STAT_SMALL].allocated, 1);
  CHECK_EQ(s.allocation[STASH_STAT_LARGE].allocated, 3);
  CHECK_EQ(s.requested_bytes[STASH_STAT_ALL].allocated, 1000 + 58 * MiB);
  CHECK_EQ(s.requested_bytes[STASH_STAT_ALL].current, 30 * MiB);
  CHECK_EQ(s.oversize_allocations.current, 1);
  CHECK_EQ(s.oversize_allocations.peak, 2);
  CHECK_EQ(s.oversize_allocations.allocated, 2);
  CHECK_EQ(s.oversize_allocations.freed, 1);
  CHECK(s.oversize_segments.current >= 2);
  CHECK(s.segment[STASH_STAT_ALL].current >= 4);
  CHECK(s.num_device_alloc >= 4);
  CHECK_EQ(s.max_split_size, 20 * MiB);
  /* the peaks differ from the currents, so the reset below has something to do */
  CHECK(s.allocation[STASH_STAT_ALL].peak != s.allocation[STASH_STAT_ALL].current);
  CHECK(s.allocated_bytes[STASH_STAT_ALL].peak != s.allocated_bytes[STASH_STAT_ALL].current);
  CHECK(s.active_bytes[STASH_STAT_LARGE].peak != s.active_bytes[STASH_STAT_LARGE].current);
  CHECK(s.oversize_allocations.peak != s.oversize_allocations.current);

  /* the JSON of a real heap's stats reads back */
  static char json[65536];
  static kv_t kv[MAX_KEYS];
  stash_stats_json(&s, json, sizeof json);
  int n = parse_json(json, kv);
  CHECK_EQ(n, 123); /* PyTorch's 122 keys and num_stream_waits */
  const kv_t* e = n > 0 ? find_key(kv, n, "allocation.all.peak") : NULL;
  CHECK(e && e->value == 4);
  e = n > 0 ? find_key(kv, n, "oversize_allocations.peak") : NULL;
  CHECK(e && e->value == 2);
  e = n > 0 ? find_key(kv, n, "max_split_size") : NULL;
  CHECK(e && e->value == 20 * MiB);

  static char table[16384];
  size_t tl = stash_stats_summary(&s, 0, false, table, sizeof table);
  CHECK_EQ(tl, strlen(table));
  CHECK_EQ(check_lines_77(table), 47);
  CHECK_STR_CONTAINS(table, "| Allocations           |       1    |       4    |       4    |       3    |\n");

  /* reset_peak_stats: every peak becomes its current; nothing else changes */
  stash_stats_t before = s;
  CHECK_OK(stash_heap_reset_peak_stats(h));
  stats_of(h, &s);
  for (int a = 0; a < 9; a++)
    for (int p = 0; p < 3; p++) {
      stash_stat_t* st = &array_of(&s, a)[p];
      stash_stat_t* b = &array_of(&before, a)[p];
      CHECK_EQ(st->peak, st->current);
      CHECK_EQ(st->current, b->current);
      CHECK_EQ(st->allocated, b->allocated);
      CHECK_EQ(st->freed, b->freed);
    }
  for (int k = 0; k < 2; k++) {
    CHECK_EQ(single_of(&s, k)->peak, single_of(&s, k)->current);
    CHECK_EQ(single_of(&s, k)->current, single_of(&before, k)->current);
    CHECK_EQ(single_of(&s, k)->allocated, single_of(&before, k)->allocated);
    CHECK_EQ(single_of(&s, k)->freed, single_of(&before, k)->freed);
  }
  CHECK_EQ(s.oversize_allocations.peak, 1);
  for (int c = 0; c < 6; c++) CHECK_EQ(*counter_of(&s, c), *counter_of(&before, c));
  CHECK_OK(stash_heap_check(h));

  /* a new allocation raises the peak from the reset value */
  CHECK_OK(stash_heap_alloc(h, 1000, stream, &extra));
  stats_of(h, &s);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 2);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].peak, 2);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].allocated, 5);

  /* reset_accumulated_stats: allocated/freed and the num_* counters go to 0, current and
   * peak stay */
  before = s;
  CHECK(before.num_device_alloc > 0);
  CHECK_OK(stash_heap_reset_accumulated_stats(h));
  stash_sim_reset_calls(sim);
  stats_of(h, &s);
  for (int a = 0; a < 9; a++)
    for (int p = 0; p < 3; p++) {
      stash_stat_t* st = &array_of(&s, a)[p];
      stash_stat_t* b = &array_of(&before, a)[p];
      CHECK_EQ(st->allocated, 0);
      CHECK_EQ(st->freed, 0);
      CHECK_EQ(st->current, b->current);
      CHECK_EQ(st->peak, b->peak);
    }
  for (int k = 0; k < 2; k++) {
    CHECK_EQ(single_of(&s, k)->allocated, 0);
    CHECK_EQ(single_of(&s, k)->freed, 0);
    CHECK_EQ(single_of(&s, k)->current, single_of(&before, k)->current);
    CHECK_EQ(single_of(&s, k)->peak, single_of(&before, k)->peak);
  }
  for (int c = 0; c < 6; c++) CHECK_EQ(*counter_of(&s, c), 0);
  CHECK(before.oversize_allocations.allocated > 0);
  CHECK_EQ(s.max_split_size, 20 * MiB); /* configuration, not a counter */
  CHECK_OK(stash_heap_check(h));

  /* counting starts again from zero */
  CHECK_OK(stash_heap_free(h, extra));
  CHECK_OK(stash_heap_free(h, big));
  CHECK_OK(stash_heap_empty_cache(h));
  stats_of(h, &s);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].allocated, 0);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].freed, 2);
  CHECK_EQ(s.allocation[STASH_STAT_ALL].current, 0);
  CHECK_EQ(s.segment[STASH_STAT_ALL].current, 0);
  CHECK_EQ(s.segment[STASH_STAT_ALL].freed, before.segment[STASH_STAT_ALL].current);
  CHECK_EQ(s.num_device_alloc, (int64_t)stash_sim_calls(sim, STASH_CALL_mem_alloc));
  CHECK_EQ(s.num_device_free, (int64_t)stash_sim_calls(sim, STASH_CALL_mem_free));
  CHECK(s.num_device_free > 0);
  CHECK_OK(stash_heap_check(h));

  /* an older, smaller stats struct gets a prefix: nothing past its size is written */
  stats_of(h, &s);
  stash_stats_t old;
  memset(&old, 0xAB, sizeof old);
  const uint32_t old_size = (uint32_t)offsetof(stash_stats_t, segment);
  old.size = old_size;
  CHECK_OK(stash_heap_stats(h, &old));
  CHECK_EQ(old.size, old_size);
  CHECK_EQ(old.version, STASH_STATS_VERSION);
  CHECK(memcmp(old.allocation, s.allocation, sizeof s.allocation) == 0);
  const unsigned char* tail = (const unsigned char*)&old + old_size;
  bool untouched = true;
  for (size_t i = 0; i < sizeof old - old_size; i++) untouched = untouched && tail[i] == 0xAB;
  CHECK(untouched);
  /* a header-only struct is a valid (empty) prefix; smaller than that is an error */
  memset(&old, 0xAB, sizeof old);
  old.size = (uint32_t)offsetof(stash_stats_t, allocation);
  CHECK_OK(stash_heap_stats(h, &old));
  CHECK_EQ(old.version, STASH_STATS_VERSION);
  CHECK(((const unsigned char*)&old)[offsetof(stash_stats_t, allocation)] == 0xAB);
  old.size = 0;
  CHECK_EQ(stash_heap_stats(h, &old), STASH_ERR_INVALID);
  CHECK_EQ(stash_heap_stats(h, NULL), STASH_ERR_INVALID);

  CHECK_OK(stash_heap_destroy(h));
  stash_sim_usage_t u;
  stash_sim_usage(sim, 0, &u);
  CHECK_EQ(u.allocations, 0);
  CHECK_EQ(u.used_bytes, 0);
  stash_sim_destroy(sim);
}

/* The heap checks' comparison of the statistics with the counts from the blocks. */
TEST(stats_check_names_what_disagrees) {
  stash_stats_t st = {0};
  stash_stat_counts_t n = {0};
  CHECK_OK(_stash_stats_check(&st, &n));
  st.active_bytes[STASH_STAT_SMALL].current = st.active_bytes[STASH_STAT_SMALL].peak = 512;
  st.active_bytes[STASH_STAT_ALL].current = st.active_bytes[STASH_STAT_ALL].peak = 512;
  CHECK_EQ(_stash_stats_check(&st, &n), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "active_bytes.small_pool.current is 512, the blocks say 0");
  n.active_bytes[STASH_STAT_SMALL] = 512;
  CHECK_OK(_stash_stats_check(&st, &n));
  st.segment[STASH_STAT_ALL].current = st.segment[STASH_STAT_ALL].peak = 1;
  CHECK_EQ(_stash_stats_check(&st, &n), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "segment.all.current is not the sum of the pools");
  st.segment[STASH_STAT_ALL].current = 0;
  st.reserved_bytes[STASH_STAT_LARGE].current = st.reserved_bytes[STASH_STAT_ALL].current = 4;
  n.reserved_bytes[STASH_STAT_LARGE] = 4;
  CHECK_EQ(_stash_stats_check(&st, &n), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "reserved_bytes peak below current");
}

int main(void) {
  RUN(json_keys_and_values);
  RUN(json_of_a_version_1_struct);
  RUN(json_truncation);
  RUN(summary_exact_text);
  RUN(summary_abbreviated_drops_pool_rows);
  RUN(summary_title_and_zero_stats);
  RUN(summary_truncation);
  RUN(heap_stats_and_resets);
  RUN(stats_check_names_what_disagrees);
  TEST_MAIN_END();
}
