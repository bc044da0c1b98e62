/* testhelper.h: a minimal harness. CHECK(cond) records a failure with its line and
 * continues; main returns the failure count (0: pass). TEST(name) { ... } defines a test
 * run by RUN(name). */
#ifndef STASH_TESTHELPER_H
#define STASH_TESTHELPER_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int th_failures;

/* xorshift64: the tests' reproducible random numbers; *state must start non-zero. */
static inline uint64_t th_random(uint64_t* state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *state = x;
}
static const char* th_current = "";

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      th_failures++;                                                                  \
      fprintf(stderr, "%s:%d: [%s] CHECK failed: %s\n", __FILE__, __LINE__, th_current, \
              #cond);                                                                 \
    }                                                                                 \
  } while (0)

#define CHECK_EQ(a, b)                                                                     \
  do {                                                                                     \
    long long a_ = (long long)(a), b_ = (long long)(b);                                    \
    if (a_ != b_) {                                                                        \
      th_failures++;                                                                       \
      fprintf(stderr, "%s:%d: [%s] CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__,  \
              __LINE__, th_current, #a, #b, a_, b_);                                       \
    }                                                                                      \
  } while (0)

#define CHECK_OK(expr)                                                                     \
  do {                                                                                     \
    int st_ = (int)(expr);                                                                 \
    if (st_ != 0) {                                                                        \
      th_failures++;                                                                       \
      fprintf(stderr, "%s:%d: [%s] %s returned %d: %s\n", __FILE__, __LINE__, th_current,  \
              #expr, st_, stash_last_error());                                             \
    }                                                                                      \
  } while (0)

#define CHECK_STR_EQ(got, want)                                                            \
  do {                                                                                     \
    const char* g_ = (got);                                                                \
    if (!g_ || strcmp(g_, (want)) != 0) {                                                  \
      th_failures++;                                                                       \
      fprintf(stderr, "%s:%d: [%s] '%s' is not '%s'\n", __FILE__, __LINE__, th_current,    \
              g_ ? g_ : "(null)", (want));                                                 \
    }                                                                                      \
  } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                    \
  do {                                                                                     \
    const char* h_ = (hay);                                                                \
    if (!h_ || !strstr(h_, (needle))) {                                                    \
      th_failures++;                                                                       \
      fprintf(stderr, "%s:%d: [%s] '%s' does not contain '%s'\n", __FILE__, __LINE__,      \
              th_current, h_ ? h_ : "(null)", (needle));                                  \
    }                                                                                      \
  } while (0)

#define TEST(name) static void test_##name(void)
#define RUN(name)             \
  do {                        \
    th_current = #name;       \
    test_##name();            \
  } while (0)

#define TEST_MAIN_END()                                                       \
  do {                                                                        \
    if (th_failures) fprintf(stderr, "%d check(s) failed\n", th_failures);    \
    return th_failures ? 1 : 0;                                               \
  } while (0)

#endif
