/* test-conf: stash_conf_init / stash_conf_parse / stash_conf_format.
 *
 * The grammar and the value rules are PyTorch's PYTORCH_CUDA_ALLOC_CONF (PyTorch 2.11,
 * c10/core/AllocatorConfig.{h,cpp}): whitespace is dropped, "key:value,key:[a:b,c:d]",
 * roundup_power2_divisions lists as AcceleratorAllocatorConfig::parseRoundUpPower2Divisions. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "stash.h"
#include "stash_provider.h"
#include "testhelper.h"

#define MiB ((size_t)1 << 20)
#define NB STASH_ROUNDUP_BUCKETS

/* ---- helpers ------------------------------------------------------------------------- */

/* Every field of a and b equal (field by field, not memcmp: padding is not compared). */
static void check_conf_equal_(int line, const stash_conf_t* a, const stash_conf_t* b,
                              const char* what) {
  int before = th_failures;
  CHECK_EQ(a->size, b->size);
  CHECK_EQ(a->version, b->version);
  CHECK_EQ(a->policy, b->policy);
  CHECK_EQ(a->max_split_size, b->max_split_size);
  CHECK_EQ(a->max_non_split_rounding, b->max_non_split_rounding);
  CHECK_EQ(a->large_segment_size, b->large_segment_size);
  CHECK(a->garbage_collection_threshold == b->garbage_collection_threshold);
  CHECK(a->per_process_memory_fraction == b->per_process_memory_fraction);
  CHECK_EQ(a->expandable_segments, b->expandable_segments);
  CHECK_EQ(a->max_piece_size, b->max_piece_size);
  CHECK_EQ(a->stream_waits, b->stream_waits);
  for (int i = 0; i < NB; i++) CHECK_EQ(a->roundup_power2_divisions[i], b->roundup_power2_divisions[i]);
  if (th_failures != before) fprintf(stderr, "  ^ confs differ (%s), line %d\n", what, line);
}
#define CHECK_CONF_EQUAL(a, b, what) check_conf_equal_(__LINE__, (a), (b), (what))

static void check_divs_(int line, const stash_conf_t* c, const uint32_t want[NB],
                        const char* what) {
  int before = th_failures;
  for (int i = 0; i < NB; i++) CHECK_EQ(c->roundup_power2_divisions[i], want[i]);
  if (th_failures != before) {
    fprintf(stderr, "  ^ roundup buckets for \"%s\" (line %d): got", what, line);
    for (int i = 0; i < NB; i++) fprintf(stderr, " %u", c->roundup_power2_divisions[i]);
    fprintf(stderr, ", want");
    for (int i = 0; i < NB; i++) fprintf(stderr, " %u", want[i]);
    fprintf(stderr, "\n");
  }
}
#define CHECK_DIVS(c, want, what) check_divs_(__LINE__, (c), (want), (what))

/* The defaults under policy:pytorch, whose keys most of these tests exercise. */
static void pytorch_init(stash_conf_t* c) {
  stash_conf_init(c);
  c->policy = STASH_POLICY_PYTORCH;
}

/* Parse text into a fresh default conf (policy:pytorch), expecting success. */
static stash_conf_t parsed_(int line, const char* text) {
  stash_conf_t c;
  pytorch_init(&c);
  stash_status_t st = stash_conf_parse(&c, text);
  if (st != STASH_OK) {
    th_failures++;
    fprintf(stderr, "%s:%d: [%s] parse of \"%s\" failed: %s: %s\n", __FILE__, line,
            th_current, text, stash_status_name(st), stash_last_error());
  }
  return c;
}
#define PARSED(text) parsed_(__LINE__, (text))

/* The base a bad input is applied to: not the defaults, so that a partial application of
 * the bad text (or a reset to defaults) shows. */
static const char k_base[] =
    "policy:pytorch,max_split_size_mb:100,large_segment_size_mb:30,roundup_power2_divisions:[2:4,>:8],"
    "garbage_collection_threshold:0.5,per_process_memory_fraction:0.75";
/* Valid keys put before a bad one: they must not be applied either. */
static const char k_valid_prefix[] =
    "expandable_segments:True,max_non_split_rounding_mb:40,policy:pytorch,";

/* text must fail with STASH_ERR_CONF, leave the conf byte for byte unchanged, and the
 * message must contain needle1 and needle2 (each may be NULL). */
static void expect_bad_(int line, const char* text, const char* needle1, const char* needle2) {
  int before = th_failures;
  for (int variant = 0; variant < 2; variant++) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%s", variant ? k_valid_prefix : "", text);
    stash_conf_t c, saved;
    stash_conf_init(&c);
    CHECK_OK(stash_conf_parse(&c, k_base));
    memcpy(&saved, &c, sizeof c);
    stash_status_t st = stash_conf_parse(&c, buf);
    CHECK_EQ(st, STASH_ERR_CONF);
    CHECK(memcmp(&c, &saved, sizeof c) == 0);
    if (variant == 0) {
      if (needle1) CHECK_STR_CONTAINS(stash_last_error(), needle1);
      if (needle2) CHECK_STR_CONTAINS(stash_last_error(), needle2);
    }
    if (th_failures != before) {
      fprintf(stderr, "  ^ bad input \"%s\" (line %d); message: %s\n", buf, line,
              stash_last_error());
      return;
    }
  }
}
#define EXPECT_BAD(text, n1, n2) expect_bad_(__LINE__, (text), (n1), (n2))

/* ---- defaults ------------------------------------------------------------------------ */

TEST(defaults) {
  stash_conf_t c;
  memset(&c, 0xff, sizeof c);
  stash_conf_init(&c);
  CHECK_EQ(c.size, sizeof(stash_conf_t));
  CHECK_EQ(c.version, STASH_CONF_VERSION);
  CHECK_EQ(c.policy, STASH_POLICY_STASH);
  CHECK(c.max_split_size == SIZE_MAX);
  CHECK_EQ(c.max_non_split_rounding, 20 * MiB);
  CHECK_EQ(c.large_segment_size, 20 * MiB);
  CHECK(c.garbage_collection_threshold == 0.0);
  CHECK(c.per_process_memory_fraction == 1.0);
  CHECK(c.expandable_segments == false);
  for (int i = 0; i < NB; i++) CHECK_EQ(c.roundup_power2_divisions[i], 0);
}

TEST(null_and_empty_change_nothing) {
  stash_conf_t c, saved;
  stash_conf_init(&c);
  CHECK_OK(stash_conf_parse(&c, k_base));
  memcpy(&saved, &c, sizeof c);
  CHECK_OK(stash_conf_parse(&c, NULL));
  CHECK(memcmp(&c, &saved, sizeof c) == 0);
  CHECK_OK(stash_conf_parse(&c, ""));
  CHECK(memcmp(&c, &saved, sizeof c) == 0);
  /* a NULL conf is an invalid argument, not a configuration error */
  CHECK_EQ(stash_conf_parse(NULL, "max_split_size_mb:100"), STASH_ERR_INVALID);
}

/* ---- every key ------------------------------------------------------------------------ */

TEST(each_key_sets_its_field) {
  stash_conf_t d;
  pytorch_init(&d);
  stash_conf_t c;

  c = PARSED("policy:pytorch");
  CHECK_CONF_EQUAL(&c, &d, "policy:pytorch");

  c = PARSED("max_split_size_mb:100");
  CHECK_EQ(c.max_split_size, 100 * MiB);
  c.max_split_size = d.max_split_size;
  CHECK_CONF_EQUAL(&c, &d, "only max_split_size changed");

  c = PARSED("max_split_size_mb:20"); /* the minimum */
  CHECK_EQ(c.max_split_size, 20 * MiB);

  /* PyTorch clamps huge values to SIZE_MAX / 1 MiB (then * 1 MiB) */
  c = PARSED("max_split_size_mb:18446744073709551615");
  CHECK_EQ(c.max_split_size, (SIZE_MAX / MiB) * MiB);
  c = PARSED("max_split_size_mb:17592186044416"); /* 2^44: * 1 MiB would wrap to 0 */
  CHECK_EQ(c.max_split_size, (SIZE_MAX / MiB) * MiB);
  c = PARSED("max_split_size_mb:1000000000000000");
  CHECK_EQ(c.max_split_size, (SIZE_MAX / MiB) * MiB);
  c = PARSED("max_non_split_rounding_mb:17592186044416");
  CHECK_EQ(c.max_non_split_rounding, (SIZE_MAX / MiB) * MiB);

  c = PARSED("max_non_split_rounding_mb:64");
  CHECK_EQ(c.max_non_split_rounding, 64 * MiB);
  c.max_non_split_rounding = d.max_non_split_rounding;
  CHECK_CONF_EQUAL(&c, &d, "only max_non_split_rounding changed");

  /* As PyTorch 2.11: the large segment size is also the default non-split rounding, and
   * the minimum of max_split_size_mb and max_non_split_rounding_mb. */
  c = PARSED("large_segment_size_mb:12");
  CHECK_EQ(c.large_segment_size, 12 * MiB);
  CHECK_EQ(c.max_non_split_rounding, 12 * MiB);
  c.large_segment_size = d.large_segment_size;
  c.max_non_split_rounding = d.max_non_split_rounding;
  CHECK_CONF_EQUAL(&c, &d, "only large_segment_size and max_non_split_rounding changed");
  c = PARSED("large_segment_size_mb:64");
  CHECK_EQ(c.large_segment_size, 64 * MiB);
  CHECK_EQ(c.max_non_split_rounding, 64 * MiB);
  c = PARSED("large_segment_size_mb:12,max_split_size_mb:12,max_non_split_rounding_mb:16");
  CHECK_EQ(c.max_split_size, 12 * MiB);
  CHECK_EQ(c.max_non_split_rounding, 16 * MiB);
  c = PARSED("max_non_split_rounding_mb:40,large_segment_size_mb:30");
  CHECK_EQ(c.max_non_split_rounding, 40 * MiB); /* given: kept */

  c = PARSED("garbage_collection_threshold:0.6");
  CHECK(c.garbage_collection_threshold == 0.6);
  c.garbage_collection_threshold = 0;
  CHECK_CONF_EQUAL(&c, &d, "only garbage_collection_threshold changed");
  c = PARSED("garbage_collection_threshold:1e-1");
  CHECK(c.garbage_collection_threshold == 0.1);
  c = PARSED("garbage_collection_threshold:0.999");
  CHECK(c.garbage_collection_threshold == 0.999);

  c = PARSED("per_process_memory_fraction:0.5");
  CHECK(c.per_process_memory_fraction == 0.5);
  c.per_process_memory_fraction = 1.0;
  CHECK_CONF_EQUAL(&c, &d, "only per_process_memory_fraction changed");
  c = PARSED("per_process_memory_fraction:0"); /* the interval is closed */
  CHECK(c.per_process_memory_fraction == 0.0);
  c = PARSED("per_process_memory_fraction:1");
  CHECK(c.per_process_memory_fraction == 1.0);

  c = PARSED("expandable_segments:True");
  CHECK(c.expandable_segments == true);
  c.expandable_segments = false;
  CHECK_CONF_EQUAL(&c, &d, "only expandable_segments changed");
  c = PARSED("expandable_segments:True,expandable_segments:False");
  CHECK(c.expandable_segments == false);

  c = PARSED("roundup_power2_divisions:4");
  for (int i = 0; i < NB; i++) CHECK_EQ(c.roundup_power2_divisions[i], 4);
  memset(c.roundup_power2_divisions, 0, sizeof c.roundup_power2_divisions);
  CHECK_CONF_EQUAL(&c, &d, "only roundup_power2_divisions changed");

  /* accepted for compatibility, changing nothing */
  c = PARSED("backend:native");
  CHECK_CONF_EQUAL(&c, &d, "backend:native");
  c = PARSED("release_lock_on_cudamalloc:True");
  CHECK_CONF_EQUAL(&c, &d, "release_lock_on_cudamalloc:True");
}

TEST(all_keys_together_and_spaces) {
  const char* text =
      "policy:pytorch,max_split_size_mb:300,max_non_split_rounding_mb:40,"
      "large_segment_size_mb:32,roundup_power2_divisions:[1:4,64:8,>:2],"
      "garbage_collection_threshold:0.25,per_process_memory_fraction:0.8,"
      "expandable_segments:True";
  stash_conf_t c = PARSED(text);
  CHECK_EQ(c.policy, STASH_POLICY_PYTORCH);
  CHECK_EQ(c.max_split_size, 300 * MiB);
  CHECK_EQ(c.max_non_split_rounding, 40 * MiB);
  CHECK_EQ(c.large_segment_size, 32 * MiB);
  CHECK(c.garbage_collection_threshold == 0.25);
  CHECK(c.per_process_memory_fraction == 0.8);
  CHECK(c.expandable_segments == true);
  const uint32_t want[NB] = {4, 0, 0, 0, 0, 0, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  CHECK_DIVS(&c, want, text);

  /* Spaces around every token are ignored... */
  stash_conf_t s = PARSED(
      "  policy : pytorch , max_split_size_mb : 300 ,max_non_split_rounding_mb: 40 , "
      "large_segment_size_mb :32, roundup_power2_divisions : [ 1 : 4 , 64 : 8 , > : 2 ] ,"
      " garbage_collection_threshold : 0.25 , per_process_memory_fraction : 0.8 , "
      "expandable_segments : True  ");
  CHECK_CONF_EQUAL(&s, &c, "spaced text");
  /* ...and so are spaces inside a token: PyTorch's tokenizer drops whitespace, it does not
   * split at it ("3 00" is "300"). */
  stash_conf_t t = PARSED("max_split_size_mb:3 00,expandable_segments:Tr ue");
  CHECK_EQ(t.max_split_size, 300 * MiB);
  CHECK(t.expandable_segments == true);
}

TEST(keys_apply_on_top) {
  stash_conf_t c;
  pytorch_init(&c);
  CHECK_OK(stash_conf_parse(&c, "max_split_size_mb:100,roundup_power2_divisions:8"));
  CHECK_OK(stash_conf_parse(&c, "expandable_segments:True"));
  CHECK_EQ(c.max_split_size, 100 * MiB);
  CHECK(c.expandable_segments);
  for (int i = 0; i < NB; i++) CHECK_EQ(c.roundup_power2_divisions[i], 8);
  CHECK_OK(stash_conf_parse(&c, "max_split_size_mb:200,max_split_size_mb:400"));
  CHECK_EQ(c.max_split_size, 400 * MiB); /* the last occurrence wins */
  CHECK(c.expandable_segments);
  /* a list changes only the buckets it names (and those the first key fills below it) */
  CHECK_OK(stash_conf_parse(&c, "roundup_power2_divisions:[4:2]"));
  const uint32_t want[NB] = {2, 2, 2, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
  CHECK_DIVS(&c, want, "[4:2] on top of 8");
  CHECK_EQ(c.max_split_size, 400 * MiB);
}

/* ---- roundup_power2_divisions ------------------------------------------------------------ */

TEST(roundup_single_value) {
  static const uint32_t pow2[] = {1, 2, 4, 8, 16, 1024};
  for (size_t k = 0; k < sizeof pow2 / sizeof pow2[0]; k++) {
    char text[64];
    snprintf(text, sizeof text, "roundup_power2_divisions:%u", pow2[k]);
    stash_conf_t c = PARSED(text);
    uint32_t want[NB];
    for (int i = 0; i < NB; i++) want[i] = pow2[k];
    CHECK_DIVS(&c, want, text);
  }
}

TEST(roundup_lists) {
  /* The bucket of key MB is log2(MB) clamped to [0, 15]. The first key also fills every
   * bucket below its own; ">" fills every bucket after the last key given (PyTorch 2.11:
   * from last_index + 1, last_index starting at 0); buckets not named keep their value. */
  static const struct {
    const char* list;
    uint32_t want[NB];
  } cases[] = {
      {"[1:4,64:8,>:2]", {4, 0, 0, 0, 0, 0, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2}},
      {"[256:1,512:2,>:4]", {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 4, 4, 4, 4, 4}},
      {"[64:8,256:4,1024:4,>:1]", {8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 4, 1, 1, 1, 1, 1}},
      {"[2:4]", {4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"[1:2]", {2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      /* 65536 MiB -> log2 16 -> clamped to 15; 1 TiB likewise */
      {"[1:1,65536:8]", {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8}},
      {"[1:1,1048576:8]", {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8}},
      {"[32768:16]", {16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16}},
      /* divisions may be 0 in a list */
      {"[1:0,8:4,>:0]", {0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"[16:0,>:8]", {0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}},
      /* keys need not be increasing: '>' follows the last key given */
      {"[1024:2,4:8,>:1]", {2, 2, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
      /* '>' with no key before it fills from bucket 1, as PyTorch */
      {"[>:4]", {0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}},
      /* an empty list is accepted and changes nothing, as PyTorch */
      {"[]", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char text[128];
    snprintf(text, sizeof text, "roundup_power2_divisions:%s", cases[k].list);
    stash_conf_t c = PARSED(text);
    CHECK_DIVS(&c, cases[k].want, text);
  }
}

/* ---- bad inputs ------------------------------------------------------------------------- */

TEST(bad_inputs) {
  /* grammar */
  EXPECT_BAD("foo:1", "foo", NULL);
  { /* the message lists every key the parser takes, the two compatibility keys too */
    static const char* const keys[] = {"policy", "max_split_size_mb", "max_non_split_rounding_mb",
                                       "large_segment_size_mb", "roundup_power2_divisions",
                                       "garbage_collection_threshold",
                                       "per_process_memory_fraction", "expandable_segments",
                                       "max_piece_size_mb", "stream_waits", "backend",
                                       "release_lock_on_cudamalloc"};
    stash_conf_t c;
    stash_conf_init(&c);
    CHECK_EQ(stash_conf_parse(&c, "foo:1"), STASH_ERR_CONF);
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
      CHECK_STR_CONTAINS(stash_last_error(), keys[k]);
  }
  EXPECT_BAD("Max_split_size_mb:100", "Max_split_size_mb", NULL);
  EXPECT_BAD("max_split_size_mb", "max_split_size_mb", NULL);
  EXPECT_BAD("max_split_size_mb:", "max_split_size_mb", NULL);
  EXPECT_BAD("max_split_size_mb:,expandable_segments:True", "max_split_size_mb", NULL);
  EXPECT_BAD("max_split_size_mb 100", "max_split_size_mb", NULL);
  EXPECT_BAD("max_split_size_mb:100,", "trailing ','", NULL);
  EXPECT_BAD(",", "','", NULL);
  EXPECT_BAD("max_split_size_mb:100,,expandable_segments:True", "','", NULL);
  EXPECT_BAD("max_split_size_mb:100:200", "max_split_size_mb", NULL);
  EXPECT_BAD("expandable_segments:True expandable_segments:False", "expandable_segments",
             NULL);
  /* sizes in MiB */
  EXPECT_BAD("max_split_size_mb:abc", "max_split_size_mb", "'abc'");
  EXPECT_BAD("max_split_size_mb:20abc", "max_split_size_mb", "'20abc'");
  EXPECT_BAD("max_split_size_mb:19", "max_split_size_mb", "'19'");
  EXPECT_BAD("max_split_size_mb:0", "max_split_size_mb", "'0'");
  EXPECT_BAD("max_split_size_mb:-20", "max_split_size_mb", "'-20'");
  EXPECT_BAD("max_split_size_mb:2.5e2", "max_split_size_mb", "'2.5e2'");
  EXPECT_BAD("max_split_size_mb:99999999999999999999999", "max_split_size_mb",
             "99999999999999999999999");
  EXPECT_BAD("max_non_split_rounding_mb:19", "max_non_split_rounding_mb", "'19'");
  EXPECT_BAD("max_non_split_rounding_mb:x", "max_non_split_rounding_mb", "'x'");
  EXPECT_BAD("large_segment_size_mb:10", "large_segment_size_mb", "'10'");
  EXPECT_BAD("large_segment_size_mb:2", "large_segment_size_mb", "'2'");
  EXPECT_BAD("large_segment_size_mb:11", "large_segment_size_mb", "'11'");
  EXPECT_BAD("large_segment_size_mb:21", "large_segment_size_mb", "'21'");
  EXPECT_BAD("large_segment_size_mb:abc", "large_segment_size_mb", "'abc'");
  /* fractions */
  EXPECT_BAD("garbage_collection_threshold:0", "garbage_collection_threshold", "'0'");
  EXPECT_BAD("garbage_collection_threshold:1", "garbage_collection_threshold", "'1'");
  EXPECT_BAD("garbage_collection_threshold:1.5", "garbage_collection_threshold", "'1.5'");
  EXPECT_BAD("garbage_collection_threshold:-0.5", "garbage_collection_threshold", "'-0.5'");
  EXPECT_BAD("garbage_collection_threshold:nan", "garbage_collection_threshold", "'nan'");
  EXPECT_BAD("garbage_collection_threshold:0.5x", "garbage_collection_threshold", "'0.5x'");
  EXPECT_BAD("per_process_memory_fraction:-0.1", "per_process_memory_fraction", "'-0.1'");
  EXPECT_BAD("per_process_memory_fraction:1.1", "per_process_memory_fraction", "'1.1'");
  EXPECT_BAD("per_process_memory_fraction:nan", "per_process_memory_fraction", "'nan'");
  EXPECT_BAD("per_process_memory_fraction:inf", "per_process_memory_fraction", "'inf'");
  EXPECT_BAD("per_process_memory_fraction:half", "per_process_memory_fraction", "'half'");
  /* booleans: only True and False */
  EXPECT_BAD("expandable_segments:true", "expandable_segments", "'true'");
  EXPECT_BAD("expandable_segments:TRUE", "expandable_segments", "'TRUE'");
  EXPECT_BAD("expandable_segments:1", "expandable_segments", "'1'");
  EXPECT_BAD("release_lock_on_cudamalloc:yes", "release_lock_on_cudamalloc", "'yes'");
  /* roundup_power2_divisions */
  EXPECT_BAD("roundup_power2_divisions:3", "roundup_power2_divisions", "'3'");
  EXPECT_BAD("roundup_power2_divisions:0", "roundup_power2_divisions", "'0'");
  EXPECT_BAD("roundup_power2_divisions:abc", "roundup_power2_divisions", "'abc'");
  EXPECT_BAD("roundup_power2_divisions:[3:4]", "roundup_power2_divisions", "'3'");
  EXPECT_BAD("roundup_power2_divisions:[1:4,48:2]", "roundup_power2_divisions", "'48'");
  EXPECT_BAD("roundup_power2_divisions:[0:4]", "roundup_power2_divisions", "'0'");
  EXPECT_BAD("roundup_power2_divisions:[a:4]", "roundup_power2_divisions", "'a'");
  EXPECT_BAD("roundup_power2_divisions:[1:3]", "roundup_power2_divisions", "'3'");
  EXPECT_BAD("roundup_power2_divisions:[1:-4]", "roundup_power2_divisions", "'-4'");
  EXPECT_BAD("roundup_power2_divisions:[1:4,>:6]", "roundup_power2_divisions", "'6'");
  EXPECT_BAD("roundup_power2_divisions:[1:4,2:8", "roundup_power2_divisions", NULL);
  EXPECT_BAD("roundup_power2_divisions:[1:4,", "roundup_power2_divisions", NULL);
  EXPECT_BAD("roundup_power2_divisions:[1:4", "roundup_power2_divisions", NULL);
  EXPECT_BAD("roundup_power2_divisions:[", "roundup_power2_divisions", NULL);
  EXPECT_BAD("roundup_power2_divisions:[1]", "roundup_power2_divisions", NULL);
  EXPECT_BAD("roundup_power2_divisions:[1:4]x", "roundup_power2_divisions", "'x'");
  /* numbers must be whole tokens: on the defaults, where the leading number alone would be
   * a valid value */
  static const struct {
    const char* text;
    const char* value;
  } suffixed[] = {
      {"max_split_size_mb:20abc", "'20abc'"},
      {"max_split_size_mb:100MB", "'100MB'"},
      {"max_non_split_rounding_mb:20abc", "'20abc'"},
      {"large_segment_size_mb:12abc", "'12abc'"},
      {"garbage_collection_threshold:0.5x", "'0.5x'"},
      {"per_process_memory_fraction:0.5x", "'0.5x'"},
      {"roundup_power2_divisions:4x", "'4x'"},
      {"roundup_power2_divisions:[1:4x]", "'4x'"},
      {"roundup_power2_divisions:[1x:4]", "'1x'"},
      {"expandable_segments:Truex", "'Truex'"},
  };
  for (size_t k = 0; k < sizeof suffixed / sizeof suffixed[0]; k++) {
    stash_conf_t c, saved;
    stash_conf_init(&c);
    memcpy(&saved, &c, sizeof c);
    CHECK_EQ(stash_conf_parse(&c, suffixed[k].text), STASH_ERR_CONF);
    CHECK(memcmp(&c, &saved, sizeof c) == 0);
    CHECK_STR_CONTAINS(stash_last_error(), suffixed[k].value);
  }
  /* policy and backend */
  EXPECT_BAD("policy:foo", "policy", "'foo'");
  EXPECT_BAD("policy:PyTorch", "policy", "'PyTorch'");
  EXPECT_BAD("backend:cudaMallocAsync", "backend", "cudaMallocAsync");
  EXPECT_BAD("backend:foo", "backend", "'foo'");
}

/* policy:stash (the default) takes per_process_memory_fraction and max_piece_size_mb: every
 * key of policy:pytorch is refused, named in the message, in any order, and nothing changes. */
TEST(stash_policy_refuses_pytorch_keys) {
  static const struct {
    const char* text;
    const char* key;
  } keys[] = {
      {"max_split_size_mb:100", "max_split_size_mb"},
      {"max_non_split_rounding_mb:40", "max_non_split_rounding_mb"},
      {"large_segment_size_mb:40", "large_segment_size_mb"},
      {"roundup_power2_divisions:4", "roundup_power2_divisions"},
      {"roundup_power2_divisions:[>:2]", "roundup_power2_divisions"},
      {"garbage_collection_threshold:0.5", "garbage_collection_threshold"},
      {"expandable_segments:True", "expandable_segments"},
  };
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    const char* forms[3] = {"%s", "policy:stash,%s", "%s,policy:stash"};
    for (int f = 0; f < 3; f++) {
      char buf[256];
      snprintf(buf, sizeof buf, forms[f], keys[k].text);
      stash_conf_t c, saved;
      stash_conf_init(&c);
      CHECK_OK(stash_conf_parse(&c, "per_process_memory_fraction:0.5"));
      memcpy(&saved, &c, sizeof c);
      CHECK_EQ(stash_conf_parse(&c, buf), STASH_ERR_CONF);
      CHECK(memcmp(&c, &saved, sizeof c) == 0);
      CHECK_STR_CONTAINS(stash_last_error(), keys[k].key);
      CHECK_STR_CONTAINS(stash_last_error(), "policy:pytorch");
    }
    /* with policy:pytorch, before or after, the key is fine */
    char buf[256];
    stash_conf_t c;
    snprintf(buf, sizeof buf, "policy:pytorch,%s", keys[k].text);
    stash_conf_init(&c);
    CHECK_OK(stash_conf_parse(&c, buf));
    snprintf(buf, sizeof buf, "%s,policy:pytorch", keys[k].text);
    stash_conf_init(&c);
    CHECK_OK(stash_conf_parse(&c, buf));
    CHECK_EQ(c.policy, STASH_POLICY_PYTORCH);
    /* switching a conf that uses the key back to policy:stash is refused too */
    stash_conf_t saved = c;
    CHECK_EQ(stash_conf_parse(&c, "policy:stash"), STASH_ERR_CONF);
    CHECK(memcmp(&c, &saved, sizeof c) == 0);
    CHECK_STR_CONTAINS(stash_last_error(), keys[k].key);
  }
  /* values equal to the defaults are no change: accepted */
  stash_conf_t c;
  stash_conf_init(&c);
  CHECK_OK(stash_conf_parse(&c, "policy:stash,expandable_segments:False,max_non_split_rounding_mb:20,"
                                "backend:native,per_process_memory_fraction:0.9"));
  CHECK_EQ(c.policy, STASH_POLICY_STASH);
  CHECK(c.per_process_memory_fraction == 0.9);
  /* a struct filled by hand is checked when a heap is made from it */
  stash_conf_init(&c);
  c.expandable_segments = true;
  stash_sim_t* sim = NULL;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  stash_heap_t* h = NULL;
  CHECK_EQ(stash_heap_create(&c, stash_sim_provider(sim), 0, &h), STASH_ERR_CONF);
  CHECK(h == NULL);
  CHECK_STR_CONTAINS(stash_last_error(), "expandable_segments");
  stash_sim_destroy(sim);
}

/* max_piece_size_mb: policy:stash's one size key - whole MiB from 2 on, refused under
 * policy:pytorch (in either order, and when a conf that has it switches policy), and a bad
 * value changes nothing. */
TEST(max_piece_size_is_policy_stash_s) {
  stash_conf_t c;
  stash_conf_init(&c);
  CHECK_EQ(c.max_piece_size, (size_t)0);
  CHECK_OK(stash_conf_parse(&c, "max_piece_size_mb:20"));
  CHECK_EQ(c.max_piece_size, 20 * MiB);
  CHECK_EQ(c.policy, STASH_POLICY_STASH);
  CHECK_OK(stash_conf_parse(&c, "policy:stash,max_piece_size_mb:2,per_process_memory_fraction:0.5"));
  CHECK_EQ(c.max_piece_size, 2 * MiB);
  CHECK(c.per_process_memory_fraction == 0.5);
  CHECK_OK(stash_conf_parse(&c, "max_piece_size_mb:99999999999999999"));
  CHECK_EQ(c.max_piece_size, (SIZE_MAX / MiB) * MiB); /* clamped, as the other MiB keys */
  static const struct {
    const char* text;
    const char* needle;
  } bad[] = {
      {"max_piece_size_mb:1", "must be >= 2"},
      {"max_piece_size_mb:0", "must be >= 2"},
      {"max_piece_size_mb:-20", "'-20'"},
      {"max_piece_size_mb:2.5", "'2.5'"},
      {"max_piece_size_mb:20MB", "'20MB'"},
      {"max_piece_size_mb:", "expected 'max_piece_size_mb:value'"},
      {"max_piece_size_mb:20,policy:pytorch", "configures policy:stash"},
      {"policy:pytorch,max_piece_size_mb:20", "configures policy:stash"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    stash_conf_t saved;
    stash_conf_init(&c);
    CHECK_OK(stash_conf_parse(&c, "max_piece_size_mb:64,per_process_memory_fraction:0.75"));
    memcpy(&saved, &c, sizeof c);
    CHECK_EQ(stash_conf_parse(&c, bad[k].text), STASH_ERR_CONF);
    CHECK(memcmp(&c, &saved, sizeof c) == 0);
    CHECK_STR_CONTAINS(stash_last_error(), "max_piece_size_mb");
    CHECK_STR_CONTAINS(stash_last_error(), bad[k].needle);
  }
  /* a conf with it cannot switch to policy:pytorch; one under policy:pytorch cannot take it */
  stash_conf_t saved;
  stash_conf_init(&c);
  CHECK_OK(stash_conf_parse(&c, "max_piece_size_mb:20"));
  saved = c;
  CHECK_EQ(stash_conf_parse(&c, "policy:pytorch"), STASH_ERR_CONF);
  CHECK(memcmp(&c, &saved, sizeof c) == 0);
  pytorch_init(&c);
  c.max_piece_size = 20 * MiB; /* a struct filled by hand is checked when a heap is made */
  stash_sim_t* sim = NULL;
  CHECK_OK(stash_sim_create(1, 0, &sim));
  stash_heap_t* h = NULL;
  CHECK_EQ(stash_heap_create(&c, stash_sim_provider(sim), 0, &h), STASH_ERR_CONF);
  CHECK(h == NULL);
  CHECK_STR_CONTAINS(stash_last_error(), "max_piece_size_mb");
  stash_sim_destroy(sim);
}

/* stream_waits: policy:stash's, True by default; False is refused under policy:pytorch (in
 * either order, and when a conf that has it switches policy), and a bad value changes
 * nothing. */
TEST(stream_waits_is_policy_stash_s) {
  stash_conf_t c;
  stash_conf_init(&c);
  CHECK(c.stream_waits);
  CHECK_OK(stash_conf_parse(&c, "stream_waits:False"));
  CHECK(!c.stream_waits);
  CHECK_OK(stash_conf_parse(&c, "stream_waits:True"));
  CHECK(c.stream_waits);
  CHECK_OK(stash_conf_parse(&c, "policy:pytorch,stream_waits:True")); /* the default: fine */
  static const struct {
    const char* text;
    const char* needle;
  } bad[] = {
      {"stream_waits:false", "expected True or False"},
      {"stream_waits:0", "expected True or False"},
      {"stream_waits:", "expected 'stream_waits:value'"},
      {"stream_waits:False,policy:pytorch", "configures policy:stash"},
      {"policy:pytorch,stream_waits:False", "configures policy:stash"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    stash_conf_t saved;
    stash_conf_init(&c);
    CHECK_OK(stash_conf_parse(&c, "per_process_memory_fraction:0.75"));
    memcpy(&saved, &c, sizeof c);
    CHECK_EQ(stash_conf_parse(&c, bad[k].text), STASH_ERR_CONF);
    CHECK(memcmp(&c, &saved, sizeof c) == 0);
    CHECK_STR_CONTAINS(stash_last_error(), "stream_waits");
    CHECK_STR_CONTAINS(stash_last_error(), bad[k].needle);
  }
  stash_conf_t saved;
  stash_conf_init(&c);
  CHECK_OK(stash_conf_parse(&c, "stream_waits:False"));
  saved = c;
  CHECK_EQ(stash_conf_parse(&c, "policy:pytorch"), STASH_ERR_CONF);
  CHECK(memcmp(&c, &saved, sizeof c) == 0);
}

TEST(max_split_not_below_large_segment) {
  /* in one text, in either order */
  EXPECT_BAD("large_segment_size_mb:40,max_split_size_mb:30", "max_split_size_mb", NULL);
  EXPECT_BAD("max_split_size_mb:30,large_segment_size_mb:40", "max_split_size_mb", NULL);
  /* k_base has max_split_size_mb:100: a larger segment size breaks it */
  EXPECT_BAD("large_segment_size_mb:128", "max_split_size_mb", NULL);
  /* on top of an earlier parse */
  stash_conf_t c, saved;
  pytorch_init(&c);
  CHECK_OK(stash_conf_parse(&c, "large_segment_size_mb:40"));
  memcpy(&saved, &c, sizeof c);
  CHECK_EQ(stash_conf_parse(&c, "max_split_size_mb:30"), STASH_ERR_CONF);
  CHECK(memcmp(&c, &saved, sizeof c) == 0);
  CHECK_STR_CONTAINS(stash_last_error(), "max_split_size_mb");
  /* equal is fine */
  CHECK_OK(stash_conf_parse(&c, "max_split_size_mb:40"));
  CHECK_EQ(c.max_split_size, 40 * MiB);
  CHECK_EQ(c.large_segment_size, 40 * MiB);
}

/* ---- formatting ------------------------------------------------------------------------- */

/* Each key appears in text iff its field differs from the default; policy comes first. */
static void check_format_keys_(int line, const stash_conf_t* c, const char* text) {
  int before = th_failures;
  stash_conf_t d;
  stash_conf_init(&d);
  const char* policy = c->policy == STASH_POLICY_STASH ? "policy:stash" : "policy:pytorch";
  size_t n = strlen(policy);
  CHECK(strncmp(text, policy, n) == 0);
  CHECK(text[n] == '\0' || text[n] == ',');
  CHECK_EQ(strstr(text, "max_split_size_mb:") != NULL, c->max_split_size != d.max_split_size);
  CHECK_EQ(strstr(text, "max_non_split_rounding_mb:") != NULL,
           c->max_non_split_rounding != d.max_non_split_rounding);
  CHECK_EQ(strstr(text, "large_segment_size_mb:") != NULL,
           c->large_segment_size != d.large_segment_size);
  CHECK_EQ(strstr(text, "roundup_power2_divisions:") != NULL,
           memcmp(c->roundup_power2_divisions, d.roundup_power2_divisions,
                  sizeof d.roundup_power2_divisions) != 0);
  CHECK_EQ(strstr(text, "garbage_collection_threshold:") != NULL,
           c->garbage_collection_threshold != d.garbage_collection_threshold);
  CHECK_EQ(strstr(text, "per_process_memory_fraction:") != NULL,
           c->per_process_memory_fraction != d.per_process_memory_fraction);
  CHECK_EQ(strstr(text, "expandable_segments:") != NULL,
           c->expandable_segments != d.expandable_segments);
  CHECK_EQ(strstr(text, "max_piece_size_mb:") != NULL, c->max_piece_size != d.max_piece_size);
  CHECK_EQ(strstr(text, "stream_waits:False") != NULL, !c->stream_waits);
  CHECK(strstr(text, "stream_waits:True") == NULL); /* the default */
  CHECK(strstr(text, "backend") == NULL);
  if (th_failures != before) fprintf(stderr, "  ^ formatted \"%s\" (line %d)\n", text, line);
}

/* format c, check the keys, parse the text into a default conf: it must equal c. */
static void check_round_trip_(int line, const stash_conf_t* c) {
  int before = th_failures;
  char buf[2048];
  size_t len = stash_conf_format(c, buf, sizeof buf);
  CHECK_EQ(len, strlen(buf));
  check_format_keys_(line, c, buf);
  stash_conf_t back;
  stash_conf_init(&back);
  CHECK_OK(stash_conf_parse(&back, buf));
  CHECK_CONF_EQUAL(&back, c, buf);
  if (th_failures != before) fprintf(stderr, "  ^ round trip of \"%s\" (line %d)\n", buf, line);
}
#define CHECK_ROUND_TRIP(c) check_round_trip_(__LINE__, (c))

TEST(format_defaults) {
  stash_conf_t c;
  stash_conf_init(&c);
  char buf[256];
  memset(buf, 'X', sizeof buf);
  size_t len = stash_conf_format(&c, buf, sizeof buf);
  CHECK(strcmp(buf, "policy:stash") == 0);
  CHECK_EQ(len, 12);
  CHECK_OK(stash_conf_parse(&c, "per_process_memory_fraction:0.5"));
  stash_conf_format(&c, buf, sizeof buf);
  CHECK(strcmp(buf, "policy:stash,per_process_memory_fraction:0.5") == 0);
  pytorch_init(&c);
  len = stash_conf_format(&c, buf, sizeof buf);
  CHECK(strcmp(buf, "policy:pytorch") == 0);
  CHECK_EQ(len, 14);
  /* values equal to the defaults are left out even when parsed explicitly */
  CHECK_OK(stash_conf_parse(&c, "max_non_split_rounding_mb:20,large_segment_size_mb:20,"
                                "per_process_memory_fraction:1,expandable_segments:False,"
                                "backend:native"));
  len = stash_conf_format(&c, buf, sizeof buf);
  CHECK(strcmp(buf, "policy:pytorch") == 0);
  CHECK_EQ(len, 14);
  /* one key */
  c = PARSED("max_split_size_mb:100");
  len = stash_conf_format(&c, buf, sizeof buf);
  CHECK(strcmp(buf, "policy:pytorch,max_split_size_mb:100") == 0);
  CHECK_EQ(len, strlen("policy:pytorch,max_split_size_mb:100"));
  c = PARSED("expandable_segments:True");
  stash_conf_format(&c, buf, sizeof buf);
  CHECK(strcmp(buf, "policy:pytorch,expandable_segments:True") == 0);
  c = PARSED("per_process_memory_fraction:0.3");
  stash_conf_format(&c, buf, sizeof buf);
  CHECK(strcmp(buf, "policy:pytorch,per_process_memory_fraction:0.3") == 0);
}

TEST(format_round_trips) {
  static const char* const texts[] = {
      "",
      "max_split_size_mb:100",
      "max_split_size_mb:18446744073709551615",
      "max_non_split_rounding_mb:1024",
      "large_segment_size_mb:12",
      "large_segment_size_mb:64,max_split_size_mb:64",
      "garbage_collection_threshold:0.3",
      "per_process_memory_fraction:0.3",
      "per_process_memory_fraction:0",
      "garbage_collection_threshold:0.7,per_process_memory_fraction:0.3",
      "expandable_segments:True",
      "roundup_power2_divisions:4",
      "roundup_power2_divisions:[1:4,64:8,>:2]",
      "roundup_power2_divisions:[256:1,512:2,>:4]",
      "roundup_power2_divisions:[1:0,8:4,>:0]",
      "roundup_power2_divisions:[>:4]",
      "policy:pytorch,max_split_size_mb:300,max_non_split_rounding_mb:40,"
      "large_segment_size_mb:32,roundup_power2_divisions:[1:4,64:8,>:2],"
      "garbage_collection_threshold:0.25,per_process_memory_fraction:0.8,"
      "expandable_segments:True",
  };
  for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
    stash_conf_t c = PARSED(texts[k]);
    CHECK_ROUND_TRIP(&c);
  }
  /* policy:stash, alone and with the two keys it takes */
  stash_conf_t c;
  stash_conf_init(&c);
  CHECK_ROUND_TRIP(&c);
  c.per_process_memory_fraction = 0.25;
  CHECK_ROUND_TRIP(&c);
  c.max_piece_size = 20 * MiB;
  CHECK_ROUND_TRIP(&c);
  c.per_process_memory_fraction = 1.0;
  c.max_piece_size = (SIZE_MAX / MiB) * MiB; /* the largest a text can give */
  CHECK_ROUND_TRIP(&c);
  c.stream_waits = false;
  CHECK_ROUND_TRIP(&c);
  /* values set directly: fractions that need all 17 digits, arbitrary bucket arrays */
  pytorch_init(&c);
  c.garbage_collection_threshold = 1.0 / 3.0;
  c.per_process_memory_fraction = 0.1 + 0.2; /* 0.30000000000000004 */
  CHECK_ROUND_TRIP(&c);
  c.per_process_memory_fraction = 1e-9;
  c.garbage_collection_threshold = 0.9999999999999999;
  CHECK_ROUND_TRIP(&c);
  pytorch_init(&c);
  static const uint32_t divs[NB] = {0, 1, 2, 4, 8, 0, 16, 1, 1, 32, 0, 0, 64, 2, 0, 1024};
  memcpy(c.roundup_power2_divisions, divs, sizeof divs);
  CHECK_ROUND_TRIP(&c);
  c.roundup_power2_divisions[0] = 8; /* only the first bucket set */
  for (int i = 1; i < NB; i++) c.roundup_power2_divisions[i] = 0;
  CHECK_ROUND_TRIP(&c);
  c.roundup_power2_divisions[0] = 0; /* only the last */
  c.roundup_power2_divisions[NB - 1] = 2;
  CHECK_ROUND_TRIP(&c);
}

TEST(format_truncates_like_snprintf) {
  stash_conf_t c = PARSED("max_split_size_mb:100,expandable_segments:True");
  char full[256];
  size_t len = stash_conf_format(&c, full, sizeof full);
  CHECK_EQ(len, strlen(full));
  CHECK(len > 20);
  /* NULL, 0: only the length */
  CHECK_EQ(stash_conf_format(&c, NULL, 0), len);
  /* n = 1..len+1: a NUL-terminated prefix of n-1 bytes, nothing written past n */
  for (size_t n = 1; n <= len + 1; n++) {
    char buf[300];
    memset(buf, 'X', sizeof buf);
    size_t r = stash_conf_format(&c, buf, n);
    CHECK_EQ(r, len);
    CHECK_EQ(strlen(buf), n - 1);
    CHECK(strncmp(buf, full, n - 1) == 0);
    CHECK(buf[n] == 'X');
  }
  char small[10];
  memset(small, 'X', sizeof small);
  CHECK_EQ(stash_conf_format(&c, small, 8), len);
  CHECK(strcmp(small, "policy:") == 0);
  CHECK(small[8] == 'X' && small[9] == 'X');
}

int main(void) {
  RUN(defaults);
  RUN(null_and_empty_change_nothing);
  RUN(each_key_sets_its_field);
  RUN(all_keys_together_and_spaces);
  RUN(keys_apply_on_top);
  RUN(roundup_single_value);
  RUN(roundup_lists);
  RUN(bad_inputs);
  RUN(max_split_not_below_large_segment);
  RUN(stash_policy_refuses_pytorch_keys);
  RUN(max_piece_size_is_policy_stash_s);
  RUN(stream_waits_is_policy_stash_s);
  RUN(format_defaults);
  RUN(format_round_trips);
  RUN(format_truncates_like_snprintf);
  TEST_MAIN_END();
}
