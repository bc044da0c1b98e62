/* test-cuda: the CUDA provider on a real GPU. Exits 77 (CTest's skip) where there is no
 * driver or no GPU. A plain C program: it never touches the CUDA runtime, the provider
 * retains the device's primary context itself.
 *
 *  - patterns: every allocation is filled with its own pattern by the driver
 *    (cuMemsetD32Async on its stream) and read back and compared, through reuse, splits,
 *    merges and empty_cache, on plain and on virtual-memory (expandable) segments;
 *  - record_stream: a block freed after use on a second stream is not handed out again
 *    until that stream's work is done;
 *  - out of memory: more than the card has is refused after the cache is freed, and the
 *    heap keeps working; a request that fits only once the cache is freed succeeds;
 *  - empty_cache: the driver's free memory rises by exactly the bytes the heap released;
 *  - policy:stash's stitched ranges, over holes and over the small arena's pages.
 */
#include <cuda.h>
#include <cudaTypedefs.h>

#include "fixture.h"
#include "internal.h"

static PFN_cuMemsetD32Async_v3020 memset32;
static PFN_cuMemcpyDtoH_v3020 copy_to_host;
static PFN_cuStreamCreate_v2000 stream_create;
static PFN_cuStreamDestroy_v4000 stream_destroy;
static PFN_cuStreamSynchronize_v2000 stream_sync;
static PFN_cuStreamQuery_v2000 stream_query;
static PFN_cuCtxSynchronize_v2000 ctx_sync;
static PFN_cuMemGetInfo_v3020 mem_get_info;

static const stash_provider_t* g_cuda;

static stash_heap_t* open_heap(const char* conf_text) {
  stash_conf_t conf;
  stash_conf_init(&conf);
  if (stash_conf_parse(&conf, conf_text) != STASH_OK) return NULL;
  stash_heap_t* h = NULL;
  CHECK_OK(stash_heap_create(&conf, g_cuda, 0, &h));
  return h;
}

static stash_stats_t stats_of(stash_heap_t* h) {
  stash_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  stash_heap_stats(h, &s);
  return s;
}

/* ---- patterns ------------------------------------------------------------------------------ */

#define NLIVE 256
#define SAMPLE (64 * 1024) /* bytes compared at each end and in the middle */

typedef struct live_s {
  void* p;
  size_t size;
  uint32_t pattern;
  CUstream stream;
} live_t;

static uint32_t* g_host;

/* Compare the start, middle and end of an allocation with its pattern. */
static int verify(const live_t* l) {
  size_t words = l->size / 4;
  if (!words) return 1;
  size_t sample_words = SAMPLE / 4 < words ? SAMPLE / 4 : words;
  size_t starts[3] = {0, (words - sample_words) / 2, words - sample_words};
  stream_sync(l->stream);
  for (int k = 0; k < 3; k++) {
    CUresult r = copy_to_host(g_host, (CUdeviceptr)(uintptr_t)l->p + starts[k] * 4, sample_words * 4);
    if (r != CUDA_SUCCESS) return 0;
    for (size_t i = 0; i < sample_words; i++) {
      if (g_host[i] != l->pattern) {
        fprintf(stderr, "[%s] %p+%zu: word %zu is 0x%x, expected 0x%x\n", th_current, l->p,
                l->size, starts[k] + i, g_host[i], l->pattern);
        return 0;
      }
    }
  }
  return 1;
}

static void patterns(const char* conf, bool big) {
  stash_heap_t* h = open_heap(conf);
  if (!h) return;
  CUstream s[2];
  stream_create(&s[0], CU_STREAM_NON_BLOCKING);
  stream_create(&s[1], CU_STREAM_NON_BLOCKING);
  live_t live[NLIVE];
  memset(live, 0, sizeof live);
  uint64_t rng = 0x1234567887654321ULL;
  uint32_t next_pattern = 1;
  int checked = 0;
  for (int op = 0; op < 4000; op++) {
    live_t* l = &live[th_random(&rng) % NLIVE];
    if (l->p) {
      if (!verify(l)) CHECK(!"pattern intact until free");
      checked++;
      CHECK_OK(stash_heap_free(h, l->p));
      l->p = NULL;
    } else {
      size_t size;
      switch ((rng >> 20) % 4) {
        case 0: size = 4 + (rng >> 24) % 4096; break;
        case 1: size = 100 * KiB + (rng >> 24) % (900 * KiB); break;
        case 2: size = 2 * MiB + (rng >> 24) % (28 * MiB); break;
        default: size = 40 * MiB + (rng >> 24) % (80 * MiB); break;
      }
      /* requests >= 256 MiB too, which policy:stash may stitch from the holes */
      if (big && (rng >> 44) % 16 == 0) size = 256 * MiB + (rng >> 24) % (200 * MiB);
      l->stream = s[(rng >> 40) & 1];
      if (stash_heap_alloc(h, size, l->stream, &l->p) != STASH_OK) {
        CHECK(!"allocation");
        fprintf(stderr, "%s\n", stash_last_error());
        l->p = NULL;
        continue;
      }
      l->size = size;
      l->pattern = 0xA5000000u | next_pattern++;
      CHECK_EQ(memset32((CUdeviceptr)(uintptr_t)l->p, l->pattern, size / 4, l->stream), CUDA_SUCCESS);
    }
    if (op % 500 == 499) {
      for (int i = 0; i < NLIVE; i++) {
        if (live[i].p && !verify(&live[i])) CHECK(!"pattern intact (sweep)");
      }
      CHECK_OK(stash_heap_check(h));
    }
    if (op % 1000 == 999) CHECK_OK(stash_heap_empty_cache(h));
  }
  for (int i = 0; i < NLIVE; i++) {
    if (live[i].p) {
      if (!verify(&live[i])) CHECK(!"pattern intact at the end");
      CHECK_OK(stash_heap_free(h, live[i].p));
    }
  }
  stash_stats_t st = stats_of(h);
  fprintf(stderr, "  %s: %lld allocations, %d verified, %lld device allocs, %lld device frees\n",
          conf, (long long)st.allocation[0].allocated, checked, (long long)st.num_device_alloc,
          (long long)st.num_device_free);
  CHECK(st.num_device_free > 0); /* empty_cache really gave segments back */
  CHECK_OK(stash_heap_destroy(h));
  stream_destroy(s[0]);
  stream_destroy(s[1]);
}

TEST(patterns_stash) { patterns("policy:stash", true); }
TEST(patterns_plain) { patterns("policy:pytorch", false); }
TEST(patterns_expandable) { patterns("policy:pytorch,expandable_segments:True", false); }

/* ---- record_stream ----------------------------------------------------------------------- */

static void record_stream_waits(const char* conf) {
  stash_heap_t* h = open_heap(conf);
  if (!h) return;
  CUstream s1, s2;
  stream_create(&s1, CU_STREAM_NON_BLOCKING);
  stream_create(&s2, CU_STREAM_NON_BLOCKING);
  const size_t xsize = 256 * MiB, bsize = 1024 * MiB;
  void *x, *b, *y, *z;
  CHECK_OK(stash_heap_alloc(h, xsize, s1, &x));
  CHECK_OK(stash_heap_alloc(h, bsize, s2, &b));
  CHECK_EQ(memset32((CUdeviceptr)(uintptr_t)x, 0x11111111u, xsize / 4, s1), CUDA_SUCCESS);
  stream_sync(s1);
  /* Long work on s2, then a write to x on s2. */
  for (int i = 0; i < 300; i++) memset32((CUdeviceptr)(uintptr_t)b, (unsigned)i, bsize / 4, s2);
  CHECK_EQ(memset32((CUdeviceptr)(uintptr_t)x, 0xBEEFBEEFu, xsize / 4, s2), CUDA_SUCCESS);
  CHECK_OK(stash_heap_record_stream(h, x, s2));
  CHECK_OK(stash_heap_free(h, x));
  CHECK_OK(stash_heap_alloc(h, xsize, s1, &y));
  CUresult busy = stream_query(s2); /* was s2's work still running when y was handed out? */
  CHECK(y != x);
  CHECK_EQ(busy, CUDA_ERROR_NOT_READY);
  stream_sync(s2);
  int64_t reserved = stats_of(h).reserved_bytes[0].current;
  CHECK_OK(stash_heap_alloc(h, xsize, s1, &z)); /* y is live: x's memory is the only fit */
  /* the event completed: x's memory serves z (policy:pytorch: the same block; policy:stash:
   * the same pages, which may be mapped at another address) */
  if (strstr(conf, "pytorch")) CHECK(z == x);
  CHECK_EQ(stats_of(h).reserved_bytes[0].current, reserved); /* no new memory */
  live_t l = {z, xsize, 0xBEEFBEEFu, s1};
  CHECK(verify(&l)); /* and s2's write landed before it was handed out */
  CHECK_OK(stash_heap_free(h, y));
  CHECK_OK(stash_heap_free(h, z));
  CHECK_OK(stash_heap_free(h, b));
  stash_stats_t st = stats_of(h);
  CHECK_EQ(st.active[0].current, 0);
  CHECK_OK(stash_heap_destroy(h));
  stream_destroy(s1);
  stream_destroy(s2);
}

TEST(record_stream_waits_for_the_other_stream) {
  record_stream_waits("policy:pytorch");
  record_stream_waits("policy:stash"); /* z: x's memory, perhaps at another address */
}

/* ---- stream waits ------------------------------------------------------------------------ */

/* policy:stash gives s2 the block s1 has just freed, while s1's work on it is still queued, and
 * makes s2 wait for that work on the device (cuStreamWaitEvent): the host does not wait (s1 is
 * still busy when the block is handed out), and s2's write lands after s1's last one. Were the
 * wait missing, s1's queued write would land last. */
TEST(a_stream_waits_on_the_device_for_the_work_on_a_block_it_takes) {
  stash_heap_t* h = open_heap("policy:stash");
  if (!h) return;
  CUstream s1, s2;
  stream_create(&s1, CU_STREAM_NON_BLOCKING);
  stream_create(&s2, CU_STREAM_NON_BLOCKING);
  const size_t xsize = 256 * MiB, bsize = 1024 * MiB;
  void *small, *b, *x, *y;
  CHECK_OK(stash_heap_alloc(h, 4096, s1, &small)); /* a free first: not a model's loading */
  CHECK_OK(stash_heap_free(h, small));
  CHECK_OK(stash_heap_alloc(h, 4096, s2, &small)); /* s2 has allocated */
  CHECK_OK(stash_heap_alloc(h, bsize, s1, &b));
  CHECK_OK(stash_heap_alloc(h, xsize, s1, &x));
  for (int i = 0; i < 300; i++) memset32((CUdeviceptr)(uintptr_t)b, (unsigned)i, bsize / 4, s1);
  CHECK_EQ(memset32((CUdeviceptr)(uintptr_t)x, 0x11111111u, xsize / 4, s1), CUDA_SUCCESS);
  CHECK_OK(stash_heap_free(h, x));
  int64_t reserved = stats_of(h).reserved_bytes[0].current;
  CHECK_OK(stash_heap_alloc(h, xsize, s2, &y));
  CUresult busy = stream_query(s1); /* was s1's work still queued when y was handed out? */
  CHECK(y == x);
  CHECK_EQ(busy, CUDA_ERROR_NOT_READY);
  CHECK_EQ(stats_of(h).reserved_bytes[0].current, reserved); /* no new memory */
  CHECK_EQ(stats_of(h).num_stream_waits, 1);
  CHECK_EQ(memset32((CUdeviceptr)(uintptr_t)y, 0x22222222u, xsize / 4, s2), CUDA_SUCCESS);
  stream_sync(s1);
  live_t l = {y, xsize, 0x22222222u, s2};
  CHECK(verify(&l));
  CHECK_OK(stash_heap_free(h, y));
  CHECK_OK(stash_heap_free(h, b));
  CHECK_OK(stash_heap_free(h, small));
  CHECK_OK(stash_heap_destroy(h));
  stream_destroy(s1);
  stream_destroy(s2);
}

/* ---- out of memory ----------------------------------------------------------------------- */

/* Ask for more than the card has: refused with an out-of-memory message - policy:pytorch
 * after one retry (the cache released, as PyTorch does), policy:stash at once (nothing
 * released could make room). Returns the driver's free memory before. */
static size_t refuses_more_than_the_card(stash_heap_t* h, int64_t retries) {
  size_t free0 = 0, total = 0;
  CHECK_OK(stash_heap_mem_get_info(h, &free0, &total));
  void* p = (void*)1;
  CHECK_EQ(stash_heap_alloc(h, total + GiB, NULL, &p), STASH_ERR_OOM);
  CHECK(p == NULL);
  CHECK_STR_CONTAINS(stash_last_error(), "out of memory");
  CHECK_EQ(stats_of(h).num_alloc_retries, retries);
  return free0;
}

TEST(out_of_memory_frees_the_cache_and_recovers) {
  stash_heap_t* h = open_heap("policy:pytorch");
  if (!h) return;
  size_t free0 = refuses_more_than_the_card(h, 1);
  fprintf(stderr, "  %s\n", stash_last_error());
  stash_stats_t st = stats_of(h);
  CHECK_EQ(st.num_ooms, 1);
  void* small = NULL;
  CHECK_OK(stash_heap_alloc(h, MiB, NULL, &small)); /* the heap keeps working */
  CHECK_OK(stash_heap_free(h, small));
  /* Cache 60% of the free memory, then ask for 60% at once: only the cache's release can
   * make room. */
  size_t chunk = free0 / 10 * 3 / (2 * MiB) * (2 * MiB);
  void *a = NULL, *b = NULL, *c = NULL;
  CHECK_OK(stash_heap_alloc(h, chunk, NULL, &a));
  CHECK_OK(stash_heap_alloc(h, chunk, NULL, &b));
  CHECK_OK(stash_heap_free(h, a));
  CHECK_OK(stash_heap_free(h, b));
  CHECK_OK(stash_heap_alloc(h, 2 * chunk, NULL, &c));
  st = stats_of(h);
  CHECK(c != NULL);
  CHECK(st.num_device_free >= 1);
  CHECK_EQ(st.num_alloc_retries, 2);
  CHECK_OK(stash_heap_free(h, c));
  CHECK_OK(stash_heap_check(h));
  CHECK_OK(stash_heap_destroy(h));
}

/* policy:stash: the request for 60% is served from two holes of 30% - stitched, with no
 * new memory and no cache release - and the memory is usable; more than the card has is
 * refused at once, and the heap keeps working. */
TEST(stash_stitches_holes_on_the_gpu) {
  stash_heap_t* h = open_heap("policy:stash");
  if (!h) return;
  size_t free0 = refuses_more_than_the_card(h, 0);
  size_t chunk = free0 / 10 * 3 / (2 * MiB) * (2 * MiB);
  void *a = NULL, *sep = NULL, *b = NULL, *c = NULL;
  CHECK_OK(stash_heap_alloc(h, chunk, NULL, &a));
  CHECK_OK(stash_heap_alloc(h, 30 * MiB, NULL, &sep));
  CHECK_OK(stash_heap_alloc(h, chunk, NULL, &b));
  CHECK_OK(stash_heap_free(h, a));
  CHECK_OK(stash_heap_free(h, b));
  int64_t reserved = stats_of(h).reserved_bytes[0].current;
  CHECK_OK(stash_heap_alloc(h, 2 * chunk, NULL, &c));
  stash_stats_t st = stats_of(h);
  CHECK(c != NULL);
  CHECK_EQ(st.num_alloc_retries, 0);                    /* no release was needed */
  /* ~no new memory: at most the two physical allocations (up to 192 MiB each) that the
   * holes share with the separator (a range begins and ends in them, using their free
   * parts: none at all on the H200) */
  CHECK(st.reserved_bytes[0].current <= reserved + (int64_t)(2 * 192 * MiB));
  live_t l = {c, 2 * chunk, 0x5717C4EDu, NULL};
  CHECK_EQ(memset32((CUdeviceptr)(uintptr_t)c, l.pattern, l.size / 4, NULL), CUDA_SUCCESS);
  live_t ls = {sep, 30 * MiB, 0x0BADF00Du, NULL};
  CHECK_EQ(memset32((CUdeviceptr)(uintptr_t)sep, ls.pattern, ls.size / 4, NULL), CUDA_SUCCESS);
  CHECK(verify(&l));
  CHECK(verify(&ls)); /* the live block between the holes is untouched */
  fprintf(stderr, "  60%% of the card (%zu bytes) from two holes: reserved %lld -> %lld\n",
          2 * chunk, (long long)reserved, (long long)st.reserved_bytes[0].current);
  CHECK_OK(stash_heap_free(h, c));
  CHECK_OK(stash_heap_free(h, sep));
  CHECK_OK(stash_heap_check(h));
  CHECK_OK(stash_heap_destroy(h));
}

/* policy:stash: a stitched range maps the small arena's wholly free physical allocations
 * next to new memory of the large arena; written through the range and through small blocks
 * around it, every byte reads back (no overlap on the real device), and once the range's
 * block is freed, small blocks on its former pages work too. */
/* A new block of `size` bytes filled with `pattern` by the driver. */
static live_t filled(stash_heap_t* h, size_t size, uint32_t pattern) {
  live_t l = {NULL, size, pattern, NULL};
  CHECK_OK(stash_heap_alloc(h, size, NULL, &l.p));
  CHECK_EQ(memset32((CUdeviceptr)(uintptr_t)l.p, pattern, size / 4, NULL), CUDA_SUCCESS);
  return l;
}

TEST(stash_stitches_small_arena_pages_on_the_gpu) {
  stash_heap_t* h = open_heap("policy:stash");
  if (!h) return;
  /* 30 MiB of small blocks: allocations of 2, 4, 8, 8 and 8 MiB; s[5] pins the 4 MiB one,
   * so that the last three (24 MiB) are the small arena's wholly free ones */
  void* s[30];
  for (int i = 0; i < 30; i++) CHECK_OK(stash_heap_alloc(h, 1 * MiB, NULL, &s[i]));
  CHECK_EQ(stats_of(h).reserved_bytes[STASH_STAT_SMALL].current, 30 * (int64_t)MiB);
  for (int i = 0; i < 30; i++)
    if (i != 5) CHECK_OK(stash_heap_free(h, s[i]));
  live_t x = filled(h, 200 * MiB, 0x5A11A7E5u);
  /* 176 MiB of new memory: the other 24 are lent by the small arena */
  CHECK_EQ(stats_of(h).reserved_bytes[STASH_STAT_LARGE].current, 176 * (int64_t)MiB);
  live_t t[5], u[24];
  for (int i = 0; i < 5; i++) t[i] = filled(h, 1 * MiB, 0x7E570000u + (uint32_t)i);
  CHECK(verify(&x));
  for (int i = 0; i < 5; i++) CHECK(verify(&t[i]));
  CHECK_OK(stash_heap_free(h, x.p));
  for (int i = 0; i < 24; i++) u[i] = filled(h, 1 * MiB, 0x0DD50000u + (uint32_t)i);
  CHECK_EQ(stats_of(h).reserved_bytes[STASH_STAT_SMALL].current, 30 * (int64_t)MiB);
  for (int i = 0; i < 24; i++) CHECK(verify(&u[i]));
  for (int i = 0; i < 5; i++) CHECK(verify(&t[i]));
  for (int i = 0; i < 24; i++) CHECK_OK(stash_heap_free(h, u[i].p));
  for (int i = 0; i < 5; i++) CHECK_OK(stash_heap_free(h, t[i].p));
  CHECK_OK(stash_heap_free(h, s[5]));
  CHECK_OK(stash_heap_check(h));
  CHECK_OK(stash_heap_destroy(h));
}

/* ---- driver errors ----------------------------------------------------------------------- */

TEST(driver_errors_name_the_call_and_the_error) {
  /* A bogus pointer freed through the provider: the driver's name and text for the error. */
  CHECK_EQ(g_cuda->mem_free(g_cuda->ctx, 0, 0x10, 512), STASH_ERR_DRIVER);
  CHECK_STR_CONTAINS(_stash_provider_message(), "cuMemFree: CUDA_ERROR_");
  fprintf(stderr, "  %s\n", _stash_provider_message());
  /* and a device that does not exist */
  int n = 0;
  g_cuda->device_count(g_cuda->ctx, &n);
  uint64_t p = 0;
  CHECK_EQ(g_cuda->mem_alloc(g_cuda->ctx, n, 4096, &p), STASH_ERR_INVALID);
  stash_heap_t* h = NULL;
  CHECK_EQ(stash_heap_create(NULL, g_cuda, n, &h), STASH_ERR_INVALID);
  CHECK_STR_CONTAINS(stash_last_error(), "does not exist");
  /* Through a heap, a driver error reaches the caller with the driver's words. */
  stash_heap_t* heap = open_heap("policy:stash");
  if (!heap) return;
  CHECK_EQ(stash_heap_free(heap, (void*)0x10), STASH_ERR_BAD_POINTER); /* stash's own check */
  CHECK_OK(stash_heap_destroy(heap));
}

/* ---- empty_cache ------------------------------------------------------------------------- */

/* The driver's free memory once it has stopped moving (frees can land a little late). */
static size_t settled_free(void) {
  size_t prev = 0, cur = 0, tot;
  for (int i = 0; i < 50; i++) {
    ctx_sync();
    mem_get_info(&cur, &tot);
    if (i && cur == prev) break;
    prev = cur;
  }
  return cur;
}

static void empty_cache_returns_memory(const char* conf) {
  stash_heap_t* h = open_heap(conf);
  if (!h) return;
  size_t f0 = settled_free();
  void* p[6];
  const size_t sizes[6] = {GiB, 3 * MiB, 700 * KiB, 200 * MiB, 64 * MiB, 20 * MiB};
  for (int i = 0; i < 6; i++) CHECK_OK(stash_heap_alloc(h, sizes[i], NULL, &p[i]));
  for (int i = 0; i < 6; i++) CHECK_OK(stash_heap_free(h, p[i]));
  size_t f1 = settled_free();
  int64_t r1 = stats_of(h).reserved_bytes[0].current;
  CHECK_OK(stash_heap_empty_cache(h));
  size_t f2 = settled_free();
  int64_t r2 = stats_of(h).reserved_bytes[0].current;
  fprintf(stderr, "  %s: reserved %lld -> %lld; driver free %zu -> %zu -> %zu (+%lld)\n", conf,
          (long long)r1, (long long)r2, f0, f1, f2, (long long)(f2 - f1));
  CHECK(r1 > 0);
  CHECK_EQ(r2, 0);
  CHECK_EQ((int64_t)(f0 - f1), r1);      /* the cache held exactly what it reserved */
  CHECK_EQ((int64_t)(f2 - f1), r1 - r2); /* and empty_cache gave all of it back */
  CHECK_OK(stash_heap_destroy(h));
}

/* policy:stash gives back a physical allocation between live blocks, and takes it back in
 * place: the driver's free memory rises by its size, the live block after it keeps its bytes,
 * and a new block at the same address reads back what was written to it. */
TEST(empty_cache_stash_between_live_blocks) {
  stash_heap_t* h = open_heap("policy:stash");
  if (!h) return;
  void* q;
  CHECK_OK(stash_heap_alloc(h, 1000, NULL, &q)); /* a free first: no model being loaded */
  CHECK_OK(stash_heap_free(h, q));
  live_t a = filled(h, 200 * MiB, 0x11111111u);
  live_t b = filled(h, 100 * MiB, 0x22222222u); /* after a, in memory of its own */
  CHECK_OK(stash_heap_free(h, a.p));
  size_t f1 = settled_free();
  int64_t r1 = stats_of(h).reserved_bytes[0].current;
  CHECK_OK(stash_heap_empty_cache(h));
  size_t f2 = settled_free();
  int64_t r2 = stats_of(h).reserved_bytes[0].current;
  fprintf(stderr, "  between live blocks: reserved %lld -> %lld; driver free +%lld\n",
          (long long)r1, (long long)r2, (long long)(f2 - f1));
  CHECK(r1 - r2 >= 200 * (int64_t)MiB); /* a's memory went back (and the small arena's) */
  CHECK_EQ((int64_t)(f2 - f1), r1 - r2);
  CHECK(verify(&b));
  live_t c = filled(h, 200 * MiB, 0x33333333u); /* taken back where a was */
  CHECK_EQ((uintptr_t)c.p, (uintptr_t)a.p);
  CHECK(verify(&c));
  CHECK(verify(&b));
  CHECK_OK(stash_heap_check(h));
  CHECK_OK(stash_heap_free(h, c.p));
  CHECK_OK(stash_heap_free(h, b.p));
  CHECK_OK(stash_heap_destroy(h));
}

TEST(empty_cache_stash) { empty_cache_returns_memory("policy:stash"); }
TEST(empty_cache_plain) { empty_cache_returns_memory("policy:pytorch"); }
TEST(empty_cache_expandable) {
  empty_cache_returns_memory("policy:pytorch,expandable_segments:True");
}

int main(void) {
  if (stash_cuda_provider(&g_cuda) != STASH_OK) {
    printf("skipped: %s\n", stash_last_error());
    return 77;
  }
  memset32 = (PFN_cuMemsetD32Async_v3020)_stash_cuda_symbol("cuMemsetD32Async");
  copy_to_host = (PFN_cuMemcpyDtoH_v3020)_stash_cuda_symbol("cuMemcpyDtoH");
  stream_create = (PFN_cuStreamCreate_v2000)_stash_cuda_symbol("cuStreamCreate");
  stream_destroy = (PFN_cuStreamDestroy_v4000)_stash_cuda_symbol("cuStreamDestroy");
  stream_sync = (PFN_cuStreamSynchronize_v2000)_stash_cuda_symbol("cuStreamSynchronize");
  stream_query = (PFN_cuStreamQuery_v2000)_stash_cuda_symbol("cuStreamQuery");
  ctx_sync = (PFN_cuCtxSynchronize_v2000)_stash_cuda_symbol("cuCtxSynchronize");
  mem_get_info = (PFN_cuMemGetInfo_v3020)_stash_cuda_symbol("cuMemGetInfo");
  if (!memset32 || !copy_to_host || !stream_create || !stream_query || !mem_get_info ||
      _stash_cuda_context_current(0) != 0) {
    fprintf(stderr, "cannot set up the driver for the test\n");
    return 1;
  }
  g_host = malloc(SAMPLE);
  RUN(empty_cache_stash); /* first: before other tests' frees are in flight */
  RUN(empty_cache_plain);
  RUN(empty_cache_expandable);
  RUN(empty_cache_stash_between_live_blocks);
  RUN(patterns_stash);
  RUN(patterns_plain);
  RUN(patterns_expandable);
  RUN(record_stream_waits_for_the_other_stream);
  RUN(a_stream_waits_on_the_device_for_the_work_on_a_block_it_takes);
  RUN(out_of_memory_frees_the_cache_and_recovers);
  RUN(stash_stitches_holes_on_the_gpu);
  RUN(stash_stitches_small_arena_pages_on_the_gpu);
  RUN(driver_errors_name_the_call_and_the_error);
  free(g_host);
  TEST_MAIN_END();
}
