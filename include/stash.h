/* stash: a GPU memory caching allocator.
 *
 * This is the whole public API. A *heap* caches the device memory of one device: it asks a
 * memory *provider* (stash_provider.h; the only code that talks to a driver) for segments,
 * serves requests from them under a *policy*, and keeps PyTorch-compatible statistics.
 *
 * Conventions
 *  - Every fallible function returns a stash_status_t; STASH_OK (0) is success. Results come
 *    back through out-parameters. On failure, stash_last_error() holds a one-line message
 *    for the calling thread, and the heap is left exactly as consistent as before the call.
 *  - Device pointers and streams are opaque: a stream is the driver's stream handle
 *    (a CUstream / cudaStream_t) passed as void*; NULL is the default stream.
 *  - Thread safety: every stash_heap_* function may be called from any thread at any time;
 *    each heap serializes its calls with its own mutex. Destroying a heap while another
 *    thread uses it is the caller's error.
 */
#ifndef STASH_H
#define STASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stash_stats.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define STASH_API __attribute__((visibility("default")))
#else
#define STASH_API
#endif

#define STASH_VERSION_MAJOR 0
#define STASH_VERSION_MINOR 1
#define STASH_VERSION_PATCH 0

/* ---- Status codes ---------------------------------------------------------------------- */

#define STASH_STATUS_LIST(X)                                                               \
  X(STASH_OK, 0, "success")                                                                \
  X(STASH_ERR_OOM, 1, "out of device memory")                                              \
  X(STASH_ERR_INVALID, 2, "invalid argument")                                              \
  X(STASH_ERR_BAD_POINTER, 3, "pointer not allocated by this heap, or already freed")      \
  X(STASH_ERR_CONF, 4, "invalid configuration")                                            \
  X(STASH_ERR_DRIVER, 5, "driver error")                                                   \
  X(STASH_ERR_UNSUPPORTED, 6, "not supported by the provider")                             \
  X(STASH_ERR_NOT_READY, 7, "not ready")                                                   \
  X(STASH_ERR_HOST_OOM, 8, "out of host memory")

typedef enum stash_status_e {
#define STASH_X_(name, value, text) name = value,
  STASH_STATUS_LIST(STASH_X_)
#undef STASH_X_
} stash_status_t;

/* The constant's name ("STASH_ERR_OOM") and a short description of a status. Never NULL. */
STASH_API const char* stash_status_name(stash_status_t status);
STASH_API const char* stash_status_text(stash_status_t status);

/* The message of the last failed stash call on this thread ("" if none). The text stays
 * valid until the thread's next failing call. Thread-safe (thread-local). */
STASH_API const char* stash_last_error(void);

/* Called, if set, with every error message as it is raised (after stash_last_error() is
 * updated), on the thread that raised it. Pass NULL to remove. Errors are also printed to
 * stderr when the environment variable STASH_SHOW_ERRORS=1 is set. Not thread-safe with
 * respect to concurrent stash_set_error_handler calls. */
typedef void (*stash_error_fn)(stash_status_t status, const char* message, void* arg);
STASH_API void stash_set_error_handler(stash_error_fn fn, void* arg);

/* ---- Configuration --------------------------------------------------------------------- */

typedef enum stash_policy_e {
  STASH_POLICY_PYTORCH = 0, /* PyTorch 2.11's native caching allocator, rule for rule */
  STASH_POLICY_STASH = 1,   /* stash's own: stitched pages, shared streams (the default) */
  _STASH_POLICY_LAST
} stash_policy_t;

#define STASH_CONF_VERSION 3
#define STASH_ROUNDUP_BUCKETS 16 /* [<2 MiB, 2-4 MiB, ..., >= 32 GiB), as PyTorch */

/* A heap's configuration. Fill with stash_conf_init() and then stash_conf_parse().
 * policy:stash (the default) takes per_process_memory_fraction and max_piece_size_mb; the
 * other keys configure policy:pytorch and are refused, with an error naming them, under
 * policy:stash (and max_piece_size_mb under policy:pytorch). */
typedef struct stash_conf_s {
  uint32_t size;                        /* sizeof(stash_conf_t) */
  uint32_t version;                     /* STASH_CONF_VERSION */
  stash_policy_t policy;                /* policy:stash|pytorch (=stash) */
  size_t max_split_size;                /* max_split_size_mb, in bytes (=SIZE_MAX: unlimited) */
  size_t max_non_split_rounding;        /* max_non_split_rounding_mb, in bytes (=20 MiB) */
  size_t large_segment_size;            /* large_segment_size_mb, in bytes (=20 MiB) */
  double garbage_collection_threshold;  /* in (0,1); 0 = off (=0) */
  double per_process_memory_fraction;   /* in [0,1] (=1: unlimited) */
  bool expandable_segments;             /* (=False) */
  uint32_t roundup_power2_divisions[STASH_ROUNDUP_BUCKETS]; /* 0 = plain 512 B rounding */
  /* policy:stash: max_piece_size_mb, in bytes (=0: the policy's own sizes, and 20 MiB once
   * the heap turns tight: 90% of the device held at the first drop of live bytes). No
   * physical allocation of its large arena is larger (rounded up to the device's
   * granularity): free memory between live blocks is then whole allocations more often, which
   * a stitched range can map, at the price of more driver calls - for a run at the limit of
   * its device (README, "At the device's limit": 20 fits more runs than expandable segments
   * do). Set, the heap never turns tight. */
  size_t max_piece_size;
  /* policy:stash: stream_waits (=True). A stream that asks for memory which only another
   * stream's freed blocks could serve, before that stream's work on them is known to be over,
   * is made to wait for that work on the device (cuStreamWaitEvent, after an event recorded on
   * the other stream) and takes the block, rather than the heap growing - as cudaMallocAsync
   * does by default. The host never waits; the cost is the ordering: the asking stream's later
   * work starts after the other stream's work queued so far. False: such a block serves
   * another stream only once its event has completed, and the heap grows meanwhile. */
  bool stream_waits;
} stash_conf_t;

/* Fill conf with the defaults above (policy:stash; PyTorch's defaults for its keys). */
STASH_API void stash_conf_init(stash_conf_t* conf);

/* Apply a configuration string in PyTorch's PYTORCH_CUDA_ALLOC_CONF grammar:
 * "key:value,key:[a:b,c:d]". Keys: policy (stash|pytorch), max_split_size_mb,
 * max_non_split_rounding_mb, large_segment_size_mb, roundup_power2_divisions,
 * garbage_collection_threshold, per_process_memory_fraction, expandable_segments
 * (True/False), max_piece_size_mb and stream_waits (True/False) (policy:stash); and, so
 * that a PYTORCH_CUDA_ALLOC_CONF can be reused as it is, backend (only "native") and release_lock_on_cudamalloc (True/False, checked, no effect: stash
 * holds its heap's lock across driver calls either way). Keys are applied on top of conf's current values, then the result is
 * checked as a whole (so "expandable_segments:True,policy:pytorch" is as good as the other
 * order, and "expandable_segments:True" alone is refused: policy:stash); NULL or "" changes
 * nothing. On error conf is unchanged, the status is STASH_ERR_CONF and stash_last_error()
 * names the offending key or value. Thread-safe (touches only conf). */
STASH_API stash_status_t stash_conf_parse(stash_conf_t* conf, const char* text);

/* Write conf in the same grammar (only the keys that differ from the defaults, "policy"
 * always first) into buf, NUL-terminated and truncated to n bytes. Returns the length the
 * full text needs (excluding the NUL), as snprintf does. */
STASH_API size_t stash_conf_format(const stash_conf_t* conf, char* buf, size_t n);

/* ---- Heaps ----------------------------------------------------------------------------- */

typedef struct stash_heap_s stash_heap_t;
typedef struct stash_provider_s stash_provider_t; /* stash_provider.h */

/* Create a heap for `device` of `provider`, configured by conf (NULL: defaults). The heap
 * copies conf and the provider table; the provider's context must outlive the heap.
 * Statuses: STASH_ERR_INVALID (NULL out/provider, bad device, a provider table of an unknown
 * version or missing a required function), STASH_ERR_CONF (conf out of range),
 * STASH_ERR_HOST_OOM, or the provider's status when it cannot report the device's memory.
 * Thread-safe. */
STASH_API stash_status_t stash_heap_create(const stash_conf_t* conf,
                                           const stash_provider_t* provider, int device,
                                           stash_heap_t** out);

/* Give every segment back to the provider (live allocations included) and free the heap.
 * NULL does nothing. Returns the first provider error met while releasing (the heap is
 * freed anyway). Not thread-safe with other calls on the same heap. */
STASH_API stash_status_t stash_heap_destroy(stash_heap_t* heap);

/* Allocate `size` bytes usable on `stream`. The result is 512-byte aligned. Size 0 gives
 * *out = NULL and STASH_OK, as in PyTorch. When no cached block fits and the provider is
 * out of memory, the heap frees cached memory (PyTorch's fallbacks) and retries - except,
 * under policy:stash, for a request larger than the device (or than the memory fraction
 * allows), refused at once with the cache kept; if that fails the status is
 * STASH_ERR_OOM and stash_last_error() reports the request, the
 * device's total and free memory, what the heap has allocated and reserved, and its
 * largest free block. Other statuses: STASH_ERR_INVALID (NULL heap/out),
 * STASH_ERR_DRIVER and STASH_ERR_HOST_OOM. Thread-safe. */
STASH_API stash_status_t stash_heap_alloc(stash_heap_t* heap, size_t size, void* stream,
                                          void** out);

/* Free a pointer returned by stash_heap_alloc. Its block is reused once the work recorded
 * with stash_heap_record_stream has completed. NULL does nothing (STASH_OK). A pointer the
 * heap did not give out, or one already freed, gives STASH_ERR_BAD_POINTER and changes
 * nothing. Thread-safe. */
STASH_API stash_status_t stash_heap_free(stash_heap_t* heap, void* ptr);

/* Note that the live allocation `ptr` is used on `stream` (other than the one it was
 * allocated on): when freed, its block will not be reused until the work queued on
 * `stream` up to the free has completed. Uses on the allocation stream are ignored.
 * Statuses: STASH_ERR_BAD_POINTER for a pointer that is not a live allocation of this
 * heap, STASH_ERR_HOST_OOM. Thread-safe. */
STASH_API stash_status_t stash_heap_record_stream(stash_heap_t* heap, void* ptr, void* stream);

/* A CUDA graph capture has begun, or ended, on the heap's device (PyTorch's plug-in hooks
 * call these: stash_plugins.h). Calls nest. While a capture is underway the heap queries no
 * event and records none - the driver refuses to query an event recorded in a capture
 * (CUDA_ERROR_CAPTURED_EVENT) - so a block freed with uses on other streams stays in use
 * until the last capture has ended and its events complete, and an allocation that finds no
 * memory gives up without releasing the cache (both as PyTorch's allocator does).
 * capture_end without a capture underway is STASH_ERR_INVALID. Thread-safe. */
STASH_API stash_status_t stash_heap_capture_begin(stash_heap_t* heap);
STASH_API stash_status_t stash_heap_capture_end(stash_heap_t* heap);

/* Wait for pending cross-stream frees, then give every fully free cached segment (and
 * every fully free page of expandable segments) back to the provider. policy:stash gives
 * back every physical allocation of its arenas that lies wholly in free memory - at an
 * arena's end, and between live blocks, whose addresses then stay the arena's with no memory
 * behind them until a request that only they can hold takes them back, in place, before the
 * arena grows. Returns a provider error if one refused; what was released stays released.
 * Thread-safe. */
STASH_API stash_status_t stash_heap_empty_cache(stash_heap_t* heap);

/* Limit the memory this heap may reserve to fraction * the device's total memory
 * (fraction in [0,1]; 1 removes the limit). STASH_ERR_INVALID outside [0,1] or NaN.
 * Thread-safe. */
STASH_API stash_status_t stash_heap_set_memory_fraction(stash_heap_t* heap, double fraction);

/* The device's free and total memory, as the provider reports them. Thread-safe. */
STASH_API stash_status_t stash_heap_mem_get_info(stash_heap_t* heap, size_t* free_bytes,
                                                 size_t* total_bytes);

/* The device this heap serves. */
STASH_API int stash_heap_device(const stash_heap_t* heap);

/* A copy of the heap's configuration. */
STASH_API void stash_heap_conf(const stash_heap_t* heap, stash_conf_t* out);

/* ---- Statistics (the keys of torch.cuda.memory_stats(); see stash_stats.h) ------------- */

/* Copy the heap's statistics into *out (out->size must be set by the caller to
 * sizeof(stash_stats_t); older, smaller structs get a prefix). Thread-safe. */
STASH_API stash_status_t stash_heap_stats(stash_heap_t* heap, stash_stats_t* out);

/* Set every peak to its current value (torch.cuda.reset_peak_memory_stats). */
STASH_API stash_status_t stash_heap_reset_peak_stats(stash_heap_t* heap);

/* Zero every allocated/freed total and the num_* counters
 * (torch.cuda.reset_accumulated_memory_stats). */
STASH_API stash_status_t stash_heap_reset_accumulated_stats(stash_heap_t* heap);

/* The heap's statistics as stash_stats_json writes them (for bindings that cannot size a
 * stash_stats_t): the JSON's full length, or 0 with buf empty if the heap is NULL.
 * Thread-safe. */
STASH_API size_t stash_heap_stats_json(stash_heap_t* heap, char* buf, size_t n);
/* The heap's memory_summary() table (stash_stats_summary). Thread-safe. */
STASH_API size_t stash_heap_summary(stash_heap_t* heap, bool abbreviated, char* buf, size_t n);

/* The bytes the heap holds from its provider now (reserved_bytes.all.current), cheaply.
 * Thread-safe. */
STASH_API size_t stash_heap_reserved_bytes(stash_heap_t* heap);

/* Write stats as one JSON object with the flattened, sorted keys of
 * torch.cuda.memory_stats() ("active.all.current": 3, ...) into buf (NUL-terminated,
 * truncated to n). Returns the length the full text needs. Thread-safe. */
STASH_API size_t stash_stats_json(const stash_stats_t* stats, char* buf, size_t n);

/* Write the table of torch.cuda.memory_summary(device, abbreviated) for stats into buf
 * (NUL-terminated, truncated to n). Returns the length the full text needs. */
STASH_API size_t stash_stats_summary(const stash_stats_t* stats, int device, bool abbreviated,
                                     char* buf, size_t n);

/* ---- Introspection --------------------------------------------------------------------- */

typedef enum stash_block_state_e {
  STASH_BLOCK_ALLOCATED = 0,    /* live allocation */
  STASH_BLOCK_PENDING_FREE = 1, /* freed, waiting for recorded streams ("active_pending_free") */
  STASH_BLOCK_FREE = 2,         /* cached, reusable ("inactive") */
  STASH_BLOCK_UNMAPPED = 3,     /* reserved address space with no memory behind it */
  STASH_BLOCK_LENT = 4,         /* policy:stash: pages lent to a stitched block elsewhere */
  STASH_BLOCK_ALIAS = 5         /* policy:stash: a stitched range's pages, owned elsewhere */
} stash_block_state_t;

typedef struct stash_block_info_s {
  uintptr_t address;
  size_t size;                /* bytes the block spans */
  size_t requested_size;      /* bytes asked for (allocated and pending blocks) */
  stash_block_state_t state;
  void* stream;               /* the stream it was allocated on */
} stash_block_info_t;

typedef struct stash_segment_info_s {
  uintptr_t address;          /* start of the segment (expandable: of the reserved range) */
  size_t total_size;          /* bytes spanned by its blocks */
  size_t mapped_size;         /* bytes backed by memory (= total_size unless expandable) */
  bool is_small;              /* small pool (blocks <= 1 MiB) */
  bool is_expandable;
  void* stream;
  size_t nblocks;
} stash_segment_info_t;

/* policy:stash's segments are its two arenas (small, large: one reserved range each, its
 * mapped part tiled by blocks) and its stitched ranges: a large block at an address of its
 * own, backed by pages of the arenas (mostly the large one), which show them as LENT while
 * the block lives. A stitched range's segment has mapped_size 0 (its memory is the arenas')
 * and blocks ALLOCATED or PENDING_FREE (the block) and ALIAS (pages beyond it, or all of them
 * while the range waits, cached, for its next use).
 *
 * Calls fn once per segment, in address order, with its blocks in address order. The
 * arrays are valid only during the call; fn must not call into the heap. Stops early if fn
 * returns non-zero. Thread-safe (holds the heap's lock throughout). */
typedef int (*stash_visit_fn)(const stash_segment_info_t* segment,
                              const stash_block_info_t* blocks, void* arg);
STASH_API stash_status_t stash_heap_visit(stash_heap_t* heap, stash_visit_fn fn, void* arg);

/* Where one pool's reserved bytes are now (small: blocks up to 1 MiB; large: the rest):
 * reserved = live + rounding + pending_free + lent + holes + ends, each in bytes of the
 * pool's own segments. A policy:stash stitched range holds no memory of its own - its pages
 * are the arenas', shown there as lent - so it counts only in lent_live. (Memory the driver
 * refused access to, held unmapped until empty_cache retries it, is in reserved only.) */
typedef struct stash_account_s {
  uint64_t segments;     /* segments holding memory (an arena is one) */
  uint64_t reserved;     /* their memory */
  uint64_t live;         /* bytes asked for by the allocations there */
  uint64_t rounding;     /* bytes those allocations hold beyond what was asked */
  uint64_t pending_free; /* freed, waiting for the work of other streams that used them */
  uint64_t lent;         /* policy:stash: pages lent to stitched blocks ... */
  uint64_t lent_live;    /* ... of which those blocks asked for this much */
  uint64_t holes, nholes, largest_hole; /* free blocks with memory in use after them */
  uint64_t ends, nends;  /* free blocks at the end of their segment (an arena's free end) */
} stash_account_t;

/* Fill *out with the account of one pool of the heap now (from its segments, as
 * stash_heap_visit sees them). Thread-safe. */
STASH_API stash_status_t stash_heap_account(stash_heap_t* heap, bool small, stash_account_t* out);

/* Both pools' accounts from one view of the heap (one stash_heap_visit, under one hold of its
 * lock): with other threads allocating, two stash_heap_account calls may see two moments.
 * Either pointer may be NULL (that pool is skipped), not both. */
STASH_API stash_status_t stash_heap_accounts(stash_heap_t* heap, stash_account_t* small,
                                             stash_account_t* large);

/* The account in words, one line: "large pool: 9480.0 MiB reserved in 1 segment = 7857.4
 * live + 0.0 rounding + 0.0 pending free + 1000.0 lent to stitched blocks (1000.0 asked for)
 * + 622.5 in 27 holes (the largest 48.0) + 0.0 free at 0 segment ends" (MiB, one decimal),
 * into buf (NUL-terminated, truncated to n). Returns the length the full text needs; 0, and
 * "" written, when the pool holds no memory (no segment). */
STASH_API size_t stash_account_text(const stash_account_t* account, bool small, char* buf,
                                    size_t n);

/* Check every invariant of the heap (block chains, free lists, statistics against the
 * blocks, mappings against the provider's pages). STASH_OK, or STASH_ERR_INVALID with the
 * first broken invariant in stash_last_error(). For tests and debugging; O(heap size). */
STASH_API stash_status_t stash_heap_check(stash_heap_t* heap);

/* ---- History (PyTorch's torch.cuda.memory._record_memory_history) ----------------------- */

typedef enum stash_trace_action_e {
  STASH_TRACE_ALLOC = 0,          /* a block handed out (size: bytes asked for) */
  STASH_TRACE_FREE_REQUESTED = 1, /* the program freed it */
  STASH_TRACE_FREE_COMPLETED = 2, /* its uses on every stream are over: reusable */
  STASH_TRACE_SEGMENT_ALLOC = 3,  /* memory taken from the provider (plain segment) */
  STASH_TRACE_SEGMENT_FREE = 4,   /* and given back */
  STASH_TRACE_SEGMENT_MAP = 5,    /* memory mapped into a reserved range */
  STASH_TRACE_SEGMENT_UNMAP = 6,  /* and unmapped */
  STASH_TRACE_OOM = 7,            /* a request failed for lack of memory (size: asked) */
  _STASH_TRACE_LAST
} stash_trace_action_t;

typedef struct stash_trace_entry_s {
  stash_trace_action_t action;
  uintptr_t address;
  size_t size;
  void* stream;
  int64_t time_us; /* Unix time, microseconds */
} stash_trace_entry_t;

/* Start recording the last max_entries events of heap in a ring buffer (0: stop, and
 * forget what was recorded). Restarting with another size keeps the newest entries that
 * fit. Thread-safe. */
STASH_API stash_status_t stash_heap_record_history(stash_heap_t* heap, size_t max_entries);
/* Copy the recorded events into out, oldest first: all of them, or the newest n if there
 * are more (out may be NULL with n 0). Returns how many are recorded. Thread-safe. */
STASH_API size_t stash_heap_history(stash_heap_t* heap, stash_trace_entry_t* out, size_t n);
/* PyTorch's name for an action ("alloc", "free_requested", ..., "oom"); "?" if unknown. */
STASH_API const char* stash_trace_action_name(stash_trace_action_t action);

/* ---- The process-wide default heaps ---------------------------------------------------- */

/* Each device has one default heap, created on first use from the environment:
 *   STASH_CONF      configuration string (stash_conf_parse grammar)
 *   STASH_PROVIDER  "cuda" (GPUs) or "sim" (the simulated device); unset: cuda where the
 *                   driver sees a GPU, sim elsewhere
 *   STASH_SIM_DEVICES, STASH_SIM_CAPACITY  the simulated devices' number and size
 * A bad value is reported (stash_last_error) and no heap is created. Thread-safe. */
STASH_API stash_status_t stash_default_heap(int device, stash_heap_t** out);
/* The default heaps created so far (at most max of them into out), in device order;
 * returns how many exist. Thread-safe. */
STASH_API int stash_default_heap_list(stash_heap_t** out, int max);

/* The device the calling thread allocates on with stash_malloc (default 0). */
STASH_API stash_status_t stash_set_device(int device);
STASH_API int stash_get_device(void);

/* malloc/free on the calling thread's device's default heap. stash_malloc returns NULL on
 * failure (and for size 0); stash_last_error() says why. stash_free(NULL) does nothing; a
 * pointer that is not a live default-heap allocation is reported through stash_last_error.
 * Thread-safe. */
STASH_API void* stash_malloc(size_t size, void* stream);
STASH_API void stash_free(void* ptr);

/* Destroy every default heap (and the provider they share). For tests and clean exits;
 * no other thread may be using them. */
STASH_API void stash_default_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif /* STASH_H */
