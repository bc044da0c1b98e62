/* fuzz_conf: STASH_CONF strings (PyTorch's PYTORCH_CUDA_ALLOC_CONF grammar) from arbitrary
 * bytes. Built two ways, as fuzz_trace is: with libFuzzer (tests/fuzz/run.sh conf) and with
 * corpus_main.c to replay tests/fuzz/corpus-conf in CTest. Whatever the text:
 *  - parsing either succeeds or fails with STASH_ERR_CONF, a message, and the conf unchanged;
 *  - a conf that parses formats to a text that parses back to the same conf (every field),
 *    and formatting is the same again from there (a fixed point);
 *  - a heap made with it on a simulated device allocates, frees and is destroyed cleanly.
 * A broken expectation aborts, with a line saying which. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stash.h"
#include "stash_provider.h"

#define FUZZ_NAME "fuzz_conf"
#include "fuzz_expect.h"

/* Field by field (the struct has padding: memcmp would compare it too). */
static bool same(const stash_conf_t* a, const stash_conf_t* b) {
  if (a->policy != b->policy || a->max_split_size != b->max_split_size ||
      a->max_non_split_rounding != b->max_non_split_rounding ||
      a->large_segment_size != b->large_segment_size ||
      a->garbage_collection_threshold != b->garbage_collection_threshold ||
      a->per_process_memory_fraction != b->per_process_memory_fraction ||
      a->expandable_segments != b->expandable_segments ||
      a->max_piece_size != b->max_piece_size || a->stream_waits != b->stream_waits)
    return false;
  for (int k = 0; k < STASH_ROUNDUP_BUCKETS; k++)
    if (a->roundup_power2_divisions[k] != b->roundup_power2_divisions[k]) return false;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  char* text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0'; /* a NUL inside ends the string early: C strings */
  stash_conf_t conf, before;
  stash_conf_init(&conf);
  before = conf;
  stash_status_t rc = stash_conf_parse(&conf, text);
  if (rc != STASH_OK) {
    EXPECT(rc == STASH_ERR_CONF, "'%s': %s", text, stash_status_name(rc));
    const char* msg = stash_last_error();
    EXPECT(msg && msg[0], "'%s' refused without a message", text);
    EXPECT(same(&conf, &before), "'%s' refused, the conf changed", text);
    free(text);
    return 0;
  }
  char out[1024], again[1024];
  size_t n = stash_conf_format(&conf, out, sizeof out);
  EXPECT(n < sizeof out, "'%s' formats to %zu bytes", text, n);
  stash_conf_t back;
  stash_conf_init(&back);
  EXPECT(stash_conf_parse(&back, out) == STASH_OK, "'%s' formats to '%s', refused: %s", text,
         out, stash_last_error());
  EXPECT(same(&conf, &back), "'%s' formats to '%s', which parses to another conf", text, out);
  stash_conf_format(&back, again, sizeof again);
  EXPECT(strcmp(out, again) == 0, "'%s' formats to '%s', then to '%s'", text, out, again);
  stash_sim_t* sim = NULL;
  EXPECT(stash_sim_create(1, (size_t)1 << 30, &sim) == STASH_OK, "sim");
  stash_heap_t* heap = NULL;
  rc = stash_heap_create(&conf, stash_sim_provider(sim), 0, &heap);
  EXPECT(rc == STASH_OK, "'%s' parses, but no heap is made with it: %s", text,
         stash_last_error());
  void *a = NULL, *b = NULL;
  rc = stash_heap_alloc(heap, 3 << 20, NULL, &a);
  EXPECT(rc == STASH_OK || rc == STASH_ERR_OOM, "alloc under '%s': %s", text,
         stash_last_error());
  rc = stash_heap_alloc(heap, 4096, NULL, &b);
  EXPECT(rc == STASH_OK || rc == STASH_ERR_OOM, "alloc under '%s': %s", text,
         stash_last_error());
  EXPECT(stash_heap_free(heap, a) == STASH_OK && stash_heap_free(heap, b) == STASH_OK, "free");
  EXPECT(stash_heap_empty_cache(heap) == STASH_OK, "empty_cache");
  EXPECT(stash_heap_check(heap) == STASH_OK, "check under '%s': %s", text, stash_last_error());
  EXPECT(stash_heap_destroy(heap) == STASH_OK, "destroy");
  stash_sim_usage_t u;
  stash_sim_usage(sim, 0, &u);
  EXPECT(u.used_bytes == 0 && u.handles == 0 && u.reservations == 0, "left on the device");
  stash_sim_destroy(sim);
  free(text);
  return 0;
}
