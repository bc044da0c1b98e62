/* fuzz_expect.h: EXPECT for the fuzz targets - a broken expectation prints the condition, the
 * target's line and a message, then aborts (which libFuzzer and CTest report). FUZZ_NAME is
 * the target's name, defined before including this. */
#ifndef STASH_FUZZ_EXPECT_H
#define STASH_FUZZ_EXPECT_H
#include <stdio.h>
#include <stdlib.h>

#define EXPECT(cond, ...)                                                 \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s: %s (line %d): ", FUZZ_NAME, #cond, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, "\n");                                              \
      abort();                                                            \
    }                                                                     \
  } while (0)

#endif
