/* stash statistics: the keys of torch.cuda.memory_stats(), with the same names and meanings.
 *
 * A stash_stat_t is PyTorch's Stat: current value, peak since the last peak reset, and the
 * totals added and removed since the last accumulated reset. Array statistics hold three:
 * [STASH_STAT_ALL] "all", [STASH_STAT_SMALL] "small_pool" (blocks <= 1 MiB),
 * [STASH_STAT_LARGE] "large_pool".
 */
#ifndef STASH_STATS_H
#define STASH_STATS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* name, description (as in PyTorch's documentation) */
#define STASH_STAT_ARRAYS(X)                                                                 \
  X(allocation, "number of allocation requests received by the heap")                       \
  X(segment, "number of segments obtained from the provider")                               \
  X(active, "number of active blocks (allocated, or freed and waiting for streams)")        \
  X(inactive_split, "number of inactive, non-releasable blocks")                            \
  X(allocated_bytes, "bytes of allocated blocks")                                           \
  X(reserved_bytes, "bytes reserved from the provider")                                     \
  X(active_bytes, "bytes of active blocks")                                                 \
  X(inactive_split_bytes, "bytes of inactive, non-releasable blocks")                       \
  X(requested_bytes, "bytes requested by allocations (before rounding)")

#define STASH_STAT_SINGLES(X)                                                                \
  X(oversize_allocations, "allocations of blocks >= max_split_size")                         \
  X(oversize_segments, "segments >= max_split_size")

#define STASH_STAT_COUNTERS(X)                                                               \
  X(num_alloc_retries, "allocations that emptied the cache and retried")                    \
  X(num_ooms, "out-of-memory errors returned")                                               \
  X(num_sync_all_streams, "waits for every pending cross-stream free")                      \
  X(num_device_alloc, "provider allocations (segments allocated or ranges mapped)")         \
  X(num_device_free, "provider frees (segments freed or ranges unmapped)")

/* stash's own counters, beyond torch.cuda.memory_stats(): after max_split_size in the struct,
 * so that a caller built against version 1 still gets its prefix (STASH_STATS_VERSION 2) */
#define STASH_STAT_STASH_COUNTERS(X)                                                         \
  X(num_stream_waits, "waits made on the device for another stream's work, to give a request "\
                      "a block that stream freed (stream_waits)")

enum { STASH_STAT_ALL = 0, STASH_STAT_SMALL = 1, STASH_STAT_LARGE = 2, STASH_STAT_NTYPES = 3 };

typedef struct stash_stat_s {
  int64_t current;   /* value now */
  int64_t peak;      /* largest value since the last peak reset */
  int64_t allocated; /* total added since the last accumulated reset */
  int64_t freed;     /* total removed since the last accumulated reset */
} stash_stat_t;

/* 1: PyTorch's statistics; 2: STASH_STAT_STASH_COUNTERS added at the end. A struct of
 * version 1's size (offsetof(stash_stats_t, num_stream_waits)) is still read and filled. */
#define STASH_STATS_VERSION 2

typedef struct stash_stats_s {
  uint32_t size;    /* sizeof(stash_stats_t), set by the caller */
  uint32_t version; /* STASH_STATS_VERSION, set by stash */
#define STASH_X_(name, doc) stash_stat_t name[STASH_STAT_NTYPES];
  STASH_STAT_ARRAYS(STASH_X_)
#undef STASH_X_
#define STASH_X_(name, doc) stash_stat_t name;
  STASH_STAT_SINGLES(STASH_X_)
#undef STASH_X_
#define STASH_X_(name, doc) int64_t name;
  STASH_STAT_COUNTERS(STASH_X_)
#undef STASH_X_
  int64_t max_split_size; /* the configured max_split_size in bytes (SIZE_MAX as int64: -1) */
#define STASH_X_(name, doc) int64_t name;
  STASH_STAT_STASH_COUNTERS(STASH_X_)
#undef STASH_X_
} stash_stats_t;

#ifdef __cplusplus
}
#endif
#endif /* STASH_STATS_H */
