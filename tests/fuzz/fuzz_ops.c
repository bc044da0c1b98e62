/* fuzz_ops: the heap's API driven by arbitrary bytes - allocations of any size on three
 * streams, frees, record_stream, streams' work completing, empty_cache, graph captures, a
 * memory fraction, provider calls made to fail, bad pointers - under policy:stash and
 * policy:pytorch, on a small simulated device. Built two ways, as fuzz_trace is: with libFuzzer
 * (tests/fuzz/run.sh ops) to search, and with corpus_main.c to replay tests/fuzz/corpus-ops
 * in CTest.
 *
 * After every operation, whatever the bytes:
 *  - the heap's own check passes (stash_heap_check: every set, tag, range and statistic);
 *  - a call that fails says why (stash_last_error) with a status the API documents for it,
 *    and changes nothing: a failed allocation leaves the statistics' allocation count, a
 *    failed free leaves the block allocated;
 *  - a call fails only for a reason: no fault armed, an allocation fails only out of memory;
 *  - every live allocation is usable memory of its size, 512-byte aligned, sharing no
 *    physical byte with another, and stash_heap_visit shows it, once, as allocated;
 *  - memory another stream freed (or used, by record_stream) is handed out only once that
 *    stream's work up to the free has completed or the new owner's stream waits for it.
 * At the end, faults off and every stream's work complete, everything frees and the device
 * holds nothing. A broken expectation aborts, with a line saying which. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stash.h"
#include "stash_provider.h"

#define MiB ((size_t)1 << 20)
enum { kSlots = 32, kStreams = 3, kFreed = 256 };

#define FUZZ_NAME "fuzz_ops"
#include "fuzz_expect.h"

typedef struct slot_s {
  void* ptr;
  size_t size;
  int stream;    /* allocated on */
  unsigned uses; /* record_stream's streams, a bit each */
} slot_t;

/* Physical bytes freed on a stream and the point its work had reached then (the last kFreed
 * runs). */
typedef struct freed_s {
  uint64_t phys;
  size_t len;
  int stream;
  uint64_t point;
} freed_t;

typedef struct state_s {
  const uint8_t* in;
  size_t left;
  stash_sim_t* sim;
  stash_heap_t* heap;
  slot_t slots[kSlots];
  freed_t freed[kFreed];
  size_t nfreed; /* runs noted so far (the last kFreed kept) */
  int captures;  /* captures underway */
  bool armed;    /* a fault may be pending */
  bool verbose;  /* FUZZ_OPS_VERBOSE: each operation on stderr */
  int device;    /* the heap's device of the simulated two */
} state_t;

static void* const k_streams[kStreams] = {(void*)0x10, (void*)0x20, (void*)0x30};

static unsigned byte(state_t* s) {
  if (!s->left) return 0;
  s->left--;
  return *s->in++;
}

static unsigned word(state_t* s) { return byte(s) | byte(s) << 8; }

static int64_t allocations(state_t* s) {
  stash_stats_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  EXPECT(stash_heap_stats(s->heap, &st) == STASH_OK, "stats: %s", stash_last_error());
  return st.allocation[STASH_STAT_ALL].current;
}

/* A failed call: with a status allowed for it, a message, and (out of memory aside) only
 * where a fault was armed. */
static void failed(state_t* s, stash_status_t rc, const char* what, bool oom_ok) {
  const char* msg = stash_last_error();
  EXPECT(msg && msg[0], "%s failed (%s) without a message", what, stash_status_name(rc));
  EXPECT((rc == STASH_ERR_OOM && (oom_ok || s->armed)) ||
             (s->armed && (rc == STASH_ERR_DRIVER || rc == STASH_ERR_HOST_OOM ||
                           rc == STASH_ERR_OOM)),
         "%s: unexpected %s: %s", what, stash_status_name(rc), msg);
}

static void note_freed(state_t* s, const slot_t* b, int stream, uint64_t point) {
  for (size_t off = 0; off < b->size;) {
    uint64_t phys = 0;
    size_t run = stash_sim_translate(s->sim, s->device, (uint64_t)(uintptr_t)b->ptr + off,
                                     b->size - off, &phys);
    EXPECT(run > 0, "a live block %p+%zu is not usable at +%zu", b->ptr, b->size, off);
    s->freed[s->nfreed++ % kFreed] = (freed_t){phys, run, stream, point};
    off += run;
  }
}

/* b, just handed out on its stream: no byte of it that another stream freed lately is still
 * in that stream's work, unless b's stream waits for it. */
static void check_handed_out(state_t* s, const slot_t* b) {
  size_t n = s->nfreed < kFreed ? s->nfreed : kFreed;
  for (size_t off = 0; off < b->size;) {
    uint64_t phys = 0;
    size_t run = stash_sim_translate(s->sim, s->device, (uint64_t)(uintptr_t)b->ptr + off,
                                     b->size - off, &phys);
    EXPECT(run > 0, "allocation %p+%zu is not usable at +%zu", b->ptr, b->size, off);
    for (size_t k = 0; k < n; k++) {
      const freed_t* f = &s->freed[k];
      if (f->stream == b->stream || f->phys >= phys + run || phys >= f->phys + f->len) continue;
      EXPECT(stash_sim_ordered_after(s->sim, k_streams[f->stream], f->point,
                                     k_streams[b->stream]),
             "%p+%zu on stream %d: memory stream %d freed is still in its work", b->ptr,
             b->size, b->stream, f->stream);
    }
    off += run;
  }
}

static void check_live(state_t* s) {
  for (int i = 0; i < kSlots; i++) {
    const slot_t* a = &s->slots[i];
    if (!a->ptr) continue;
    EXPECT((uintptr_t)a->ptr % 512 == 0, "%p is not 512-aligned", a->ptr);
    EXPECT(stash_sim_is_usable(s->sim, s->device, (uint64_t)(uintptr_t)a->ptr, a->size),
           "%p+%zu is not usable memory", a->ptr, a->size);
    for (int j = i + 1; j < kSlots; j++) {
      const slot_t* b = &s->slots[j];
      if (!b->ptr) continue;
      /* no shared physical byte, however mapped: compare the runs */
      for (size_t off = 0; off < a->size;) {
        uint64_t pa = 0;
        size_t ra = stash_sim_translate(s->sim, s->device, (uint64_t)(uintptr_t)a->ptr + off,
                                        a->size - off, &pa);
        for (size_t o2 = 0; o2 < b->size;) {
          uint64_t pb = 0;
          size_t rb = stash_sim_translate(s->sim, s->device, (uint64_t)(uintptr_t)b->ptr + o2,
                                          b->size - o2, &pb);
          EXPECT(pa + ra <= pb || pb + rb <= pa, "%p+%zu and %p+%zu share memory", a->ptr,
                 a->size, b->ptr, b->size);
          o2 += rb;
        }
        off += ra;
      }
    }
  }
}

/* Sizes from a byte pair: a class (bytes to hundreds of MiB, and more than the device) and a
 * few 512-byte steps. */
static size_t size_of(unsigned w) {
  static const size_t menu[] = {0,        1,         511,       512,       4096,
                                100000,   1 * MiB,   1 * MiB + 1, 2 * MiB, 3 * MiB,
                                9 * MiB,  10 * MiB,  20 * MiB,  21 * MiB,  50 * MiB,
                                70 * MiB, 130 * MiB, 200 * MiB, 300 * MiB, 600 * MiB,
                                (size_t)5 << 30, SIZE_MAX / 2};
  size_t base = menu[(w & 0xff) % (sizeof menu / sizeof menu[0])];
  size_t extra = (size_t)(w >> 8) * 512;
  return base > SIZE_MAX / 4 ? base : base + extra;
}

/* stash_heap_visit shows every live allocation once, as allocated, with its requested size
 * and stream, and no other block as allocated. */
typedef struct seen_s {
  state_t* s;
  int allocated;
  bool found[kSlots];
} seen_t;

static int visit_segment(const stash_segment_info_t* seg, const stash_block_info_t* blocks,
                         void* arg) {
  seen_t* v = arg;
  for (size_t k = 0; k < seg->nblocks; k++) {
    const stash_block_info_t* b = &blocks[k];
    if (b->state != STASH_BLOCK_ALLOCATED) continue;
    v->allocated++;
    int i = 0;
    while (i < kSlots && (uintptr_t)v->s->slots[i].ptr != b->address) i++;
    EXPECT(i < kSlots, "visit: an allocated block at %#zx that is not live", (size_t)b->address);
    const slot_t* a = &v->s->slots[i];
    EXPECT(!v->found[i], "visit: %p shown twice", a->ptr);
    EXPECT(b->requested_size == a->size && b->size >= a->size &&
               b->stream == k_streams[a->stream],
           "visit: %p+%zu on %d shown as %zu (spanning %zu) on %p", a->ptr, a->size, a->stream,
           b->requested_size, b->size, b->stream);
    v->found[i] = true;
  }
  return 0;
}

static void check_visit(state_t* s) {
  seen_t v = {.s = s};
  EXPECT(stash_heap_visit(s->heap, visit_segment, &v) == STASH_OK, "visit: %s",
         stash_last_error());
  int live = 0;
  for (int i = 0; i < kSlots; i++) live += s->slots[i].ptr != NULL;
  EXPECT(v.allocated == live, "visit: %d allocated blocks, %d live", v.allocated, live);
}

static void op_alloc(state_t* s, int i, size_t size, int stream);

static void op_free(state_t* s, int i) {
  slot_t* b = &s->slots[i];
  if (!b->ptr) return;
  uint64_t points[kStreams];
  for (int k = 0; k < kStreams; k++) points[k] = stash_sim_stream_point(s->sim, k_streams[k]);
  int64_t before = allocations(s);
  stash_status_t rc = stash_heap_free(s->heap, b->ptr);
  if (s->verbose) fprintf(stderr, "  free %p: %s\n", b->ptr, stash_status_name(rc));
  if (rc != STASH_OK) {
    failed(s, rc, "free", false);
    EXPECT(allocations(s) == before, "a failed free changed the allocation count");
    return;
  }
  for (int k = 0; k < kStreams; k++)
    if (k == b->stream || (b->uses >> k & 1)) note_freed(s, b, k, points[k]);
  b->ptr = NULL;
}

static void op_alloc(state_t* s, int i, size_t size, int stream) {
  slot_t* b = &s->slots[i];
  if (b->ptr) op_free(s, i);
  if (b->ptr) return; /* its free failed */
  int64_t before = allocations(s);
  void* p = (void*)0x1;
  stash_status_t rc = stash_heap_alloc(s->heap, size, k_streams[stream], &p);
  if (s->verbose)
    fprintf(stderr, "  alloc %zu on %d: %s %p\n", size, stream, stash_status_name(rc), p);
  if (rc != STASH_OK) {
    failed(s, rc, "alloc", true);
    EXPECT(p == NULL, "a failed allocation set *out");
    EXPECT(allocations(s) == before, "a failed allocation changed the allocation count");
    return;
  }
  if (size == 0) {
    EXPECT(p == NULL, "size 0 gave a pointer");
    return;
  }
  EXPECT(p != NULL, "an allocation of %zu gave NULL", size);
  *b = (slot_t){p, size, stream, 0};
  check_handed_out(s, b);
}

static void print_call(void* arg, stash_provider_call_t call, uint64_t bytes, double us) {
  (void)arg, (void)us;
  fprintf(stderr, "    %s %llu\n", stash_provider_call_name(call), (unsigned long long)bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* confs[] = {
      "policy:stash", "policy:pytorch", "policy:pytorch,expandable_segments:True",
      "policy:stash,stream_waits:False",
      "policy:pytorch,garbage_collection_threshold:0.5,max_split_size_mb:40,"
      "roundup_power2_divisions:4,per_process_memory_fraction:0.8",
      "policy:pytorch,expandable_segments:True,garbage_collection_threshold:0.7,"
      "roundup_power2_divisions:[256:2,>:8],per_process_memory_fraction:0.9",
      "policy:stash,max_piece_size_mb:20", "policy:stash,per_process_memory_fraction:0.6"};
  state_t* s = calloc(1, sizeof *s);
  if (!s) return 0;
  s->in = data;
  s->left = size;
  unsigned head = byte(s);
  bool verbose = s->verbose = getenv("FUZZ_OPS_VERBOSE") != NULL;
  stash_conf_t conf;
  stash_conf_init(&conf);
  /* the first byte: the conf (bits 0, 1 and 4), the device's size (bit 2), the history
   * recorded (bit 5), the device: the first or the second of two (bit 6) */
  const char* conf_text = confs[head % 4 + 4 * (head >> 4 & 1)];
  EXPECT(stash_conf_parse(&conf, conf_text) == STASH_OK, "conf: %s", stash_last_error());
  size_t capacity = (head >> 2 & 1) ? (size_t)1 << 30 : (size_t)3 << 30;
  if (verbose) fprintf(stderr, "%s, %zu bytes\n", conf_text, capacity);
  s->device = head >> 6 & 1;
  EXPECT(stash_sim_create(2, capacity, &s->sim) == STASH_OK, "sim");
  if (verbose) stash_sim_on_call(s->sim, print_call, NULL); /* and each provider call */
  EXPECT(stash_heap_create(&conf, stash_sim_provider(s->sim), s->device, &s->heap) == STASH_OK,
         "heap: %s", stash_last_error());
  if (head >> 5 & 1)
    EXPECT(stash_heap_record_history(s->heap, 64) == STASH_OK, "history: %s",
           stash_last_error());
  for (int ops = 0; s->left && ops < 400; ops++) {
    unsigned op = byte(s) % 16;
    int i = (int)(byte(s) % kSlots);
    if (verbose)
      fprintf(stderr, "op %d: %u slot %d (%p+%zu on %d)\n", ops, op, i, s->slots[i].ptr,
              s->slots[i].size, s->slots[i].stream);
    switch (op) {
      case 0: case 1: case 2: case 3: case 4: { /* allocate (freeing the slot first) */
        size_t sz = size_of(word(s));
        op_alloc(s, i, sz, (int)(byte(s) % kStreams));
        break;
      }
      case 5: case 6: case 7:
        op_free(s, i);
        break;
      case 8: { /* record_stream */
        int k = (int)(byte(s) % kStreams);
        if (!s->slots[i].ptr) break;
        stash_status_t rc = stash_heap_record_stream(s->heap, s->slots[i].ptr, k_streams[k]);
        if (rc != STASH_OK) failed(s, rc, "record_stream", false);
        else if (k != s->slots[i].stream) s->slots[i].uses |= 1u << k;
        break;
      }
      case 9: /* a stream's work completes (or every stream's) */
        if (i < kStreams) stash_sim_complete(s->sim, k_streams[i]);
        else stash_sim_complete_all(s->sim);
        break;
      case 10: {
        stash_status_t rc = stash_heap_empty_cache(s->heap);
        if (rc != STASH_OK) failed(s, rc, "empty_cache", false);
        break;
      }
      case 11: /* a capture begins, or the last one ends */
        if (i & 1 || !s->captures) {
          EXPECT(stash_heap_capture_begin(s->heap) == STASH_OK, "capture_begin");
          s->captures++;
        } else {
          EXPECT(stash_heap_capture_end(s->heap) == STASH_OK, "capture_end");
          s->captures--;
        }
        break;
      case 12: { /* a provider call fails: the n-th of a kind from now */
        stash_provider_call_t call = (stash_provider_call_t)(byte(s) % (STASH_CALL_ANY + 1));
        stash_status_t st = i & 1 ? STASH_ERR_OOM : STASH_ERR_DRIVER;
        stash_sim_fail_nth(s->sim, call, (uint64_t)(i % 8) + 1, st);
        s->armed = true;
        break;
      }
      case 13: { /* a memory fraction, or none */
        double fraction = i == 0 ? 1.0 : (double)byte(s) / 255.0;
        EXPECT(stash_heap_set_memory_fraction(s->heap, fraction) == STASH_OK, "fraction");
        break;
      }
      case 14: { /* bad pointers: refused, nothing changed */
        int64_t before = allocations(s);
        /* inside a live block (past its first 512 bytes, where no other block starts), or
         * not 512-aligned, or nowhere */
        const slot_t* b = &s->slots[i];
        void* bad = !b->ptr ? (void*)0x12345600
                            : (char*)b->ptr + (b->size > 512 ? 512 : 1);
        EXPECT(stash_heap_free(s->heap, bad) == STASH_ERR_BAD_POINTER, "a bad free");
        EXPECT(stash_heap_record_stream(s->heap, bad, k_streams[0]) == STASH_ERR_BAD_POINTER,
               "a bad record_stream");
        EXPECT(allocations(s) == before, "a refused call changed the allocation count");
        break;
      }
      default: { /* statistics and introspection */
        char buf[256];
        (void)stash_heap_stats_json(s->heap, buf, sizeof buf);
        (void)stash_heap_summary(s->heap, i & 1, buf, sizeof buf);
        stash_account_t small, large;
        EXPECT(stash_heap_accounts(s->heap, &small, &large) == STASH_OK, "accounts");
        (void)stash_account_text(&large, false, buf, sizeof buf);
        size_t free_bytes = 0, total = 0;
        EXPECT(stash_heap_mem_get_info(s->heap, &free_bytes, &total) == STASH_OK || s->armed,
               "mem_get_info: %s", stash_last_error());
        stash_trace_entry_t last[8];
        size_t n = stash_heap_history(s->heap, last, 8);
        EXPECT(n <= 64 && (n == 0 || head >> 5 & 1), "history: %zu entries", n);
        check_visit(s);
        if (i & 1) EXPECT(stash_heap_reset_peak_stats(s->heap) == STASH_OK, "reset peaks");
        if (i & 2) EXPECT(stash_heap_reset_accumulated_stats(s->heap) == STASH_OK, "reset");
        break;
      }
    }
    stash_status_t rc = stash_heap_check(s->heap);
    EXPECT(rc == STASH_OK, "heap check after op %u: %s", op, stash_last_error());
    if (ops % 8 == 0) check_live(s);
  }
  check_live(s);
  /* the end: no faults, captures over, every stream's work done, everything freed */
  stash_sim_fail_nth(s->sim, STASH_CALL_ANY, 0, STASH_OK);
  for (int c = 0; c <= STASH_CALL_ANY; c++)
    stash_sim_fail_nth(s->sim, (stash_provider_call_t)c, 0, STASH_OK);
  s->armed = false;
  for (; s->captures; s->captures--)
    EXPECT(stash_heap_capture_end(s->heap) == STASH_OK, "capture_end");
  stash_sim_complete_all(s->sim);
  for (int i = 0; i < kSlots; i++)
    if (s->slots[i].ptr)
      EXPECT(stash_heap_free(s->heap, s->slots[i].ptr) == STASH_OK, "free at the end: %s",
             stash_last_error());
  stash_sim_complete_all(s->sim);
  EXPECT(stash_heap_empty_cache(s->heap) == STASH_OK, "empty_cache at the end: %s",
         stash_last_error());
  EXPECT(stash_heap_check(s->heap) == STASH_OK, "heap check at the end: %s",
         stash_last_error());
  stash_stats_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  EXPECT(stash_heap_stats(s->heap, &st) == STASH_OK, "stats");
  EXPECT(st.reserved_bytes[STASH_STAT_ALL].current == 0,
         "%lld bytes still reserved after empty_cache with nothing live",
         (long long)st.reserved_bytes[STASH_STAT_ALL].current);
  EXPECT(stash_heap_destroy(s->heap) == STASH_OK, "destroy: %s", stash_last_error());
  for (int d = 0; d < 2; d++) {
    stash_sim_usage_t u;
    stash_sim_usage(s->sim, d, &u);
    EXPECT(u.used_bytes == 0 && u.allocations == 0 && u.reservations == 0 && u.handles == 0 &&
               u.mapped_pages == 0 && u.events == 0,
           "device %d still holds something: %zu bytes, %zu allocations, %zu reservations, "
           "%zu handles, %zu pages, %zu events",
           d, u.used_bytes, u.allocations, u.reservations, u.handles, u.mapped_pages, u.events);
  }
  stash_sim_destroy(s->sim);
  free(s);
  return 0;
}
