/* stash memory providers: the only code that talks to a driver.
 *
 * A provider is a versioned table of functions over device memory, virtual address ranges,
 * physical pages, events and streams. Heaps copy the table when they are created; the
 * table's ctx is passed back as every function's first argument. Tables grow only by
 * appending fields and raising STASH_PROVIDER_VERSION; a NULL function means the provider
 * lacks that capability (the virtual-memory group is needed only for expandable segments).
 *
 * Every function returns a stash_status_t: STASH_OK, STASH_ERR_OOM when the device is out
 * of memory (the heap then frees its cache and retries), STASH_ERR_NOT_READY (event_query
 * only), or another status - STASH_ERR_DRIVER with a message set through
 * stash_provider_error() - for anything else.
 *
 * This file also declares the simulated provider ("sim"): a device that touches no memory,
 * for tests and for replaying traces anywhere.
 */
#ifndef STASH_PROVIDER_H
#define STASH_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stash.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 added stream_wait; a version 1 table (size offsetof(stash_provider_t,
 * stream_wait)) is still accepted, as a provider without it. */
#define STASH_PROVIDER_VERSION 2

/* Every provider call, for counters, fault injection and cost models: name, doc. */
#define STASH_PROVIDER_CALLS(X)                                                             \
  X(mem_alloc, "allocate device memory (cuMemAlloc)")                                      \
  X(mem_free, "free device memory (cuMemFree)")                                            \
  X(va_reserve, "reserve a virtual address range (cuMemAddressReserve)")                   \
  X(va_free, "free a virtual address range (cuMemAddressFree)")                            \
  X(phys_create, "create a physical allocation (cuMemCreate)")                             \
  X(phys_release, "release a physical allocation (cuMemRelease)")                          \
  X(map, "map a physical allocation at an address (cuMemMap)")                             \
  X(unmap, "unmap an address range (cuMemUnmap)")                                          \
  X(set_access, "make a mapped range accessible to the device (cuMemSetAccess)")           \
  X(event_create, "create an event (cuEventCreate)")                                       \
  X(event_record, "record an event on a stream (cuEventRecord)")                           \
  X(event_query, "ask whether an event has completed (cuEventQuery)")                      \
  X(event_synchronize, "wait for an event (cuEventSynchronize)")                           \
  X(event_destroy, "destroy an event (cuEventDestroy)")                                    \
  X(stream_synchronize, "wait for a stream's work (cuStreamSynchronize)")                  \
  X(mem_info, "the device's free and total memory (cuMemGetInfo)")                         \
  X(stream_wait, "make a stream's later work wait for an event (cuStreamWaitEvent)")

typedef enum stash_provider_call_e {
#define STASH_X_(name, doc) STASH_CALL_##name,
  STASH_PROVIDER_CALLS(STASH_X_)
#undef STASH_X_
  STASH_CALL_COUNT,          /* number of call kinds */
  STASH_CALL_ANY = STASH_CALL_COUNT /* for fault injection: any kind */
} stash_provider_call_t;

/* "mem_alloc", ... for a call kind; "any" for STASH_CALL_ANY. */
STASH_API const char* stash_provider_call_name(stash_provider_call_t call);

struct stash_provider_s {
  uint32_t version;   /* STASH_PROVIDER_VERSION the table was written for */
  uint32_t size;      /* sizeof(stash_provider_t) of that version */
  const char* name;   /* "sim", "cuda", ... */
  void* ctx;          /* passed back to every function */

  /* Devices. device_count is required. granularity: the page size of physical
   * allocations and the alignment of mappings on that device (2 MiB on current GPUs). */
  stash_status_t (*device_count)(void* ctx, int* count);
  stash_status_t (*granularity)(void* ctx, int device, size_t* bytes);
  stash_status_t (*mem_info)(void* ctx, int device, size_t* free_bytes, size_t* total_bytes);

  /* Plain device memory (required). size > 0; *ptr is at least 512-byte aligned. mem_free
   * returns once the device's queued work is done, as cuMemFree does (policy:pytorch, as
   * PyTorch, frees segments that streams' work may still use on that ground). */
  stash_status_t (*mem_alloc)(void* ctx, int device, size_t size, uint64_t* ptr);
  stash_status_t (*mem_free)(void* ctx, int device, uint64_t ptr, size_t size);

  /* Virtual memory (optional as a group). Sizes, offsets and addresses are multiples of
   * the granularity. map maps [offset, offset+size) of a physical allocation at va (one
   * physical allocation may be mapped at several addresses); the CUDA driver accepts only
   * offset 0 and the allocation's whole size, and unmaps only whole mappings
   * (docs/driver-costs.md), and stash asks for nothing else. set_access makes
   * [va, va+size) readable and writable by the device. */
  stash_status_t (*va_reserve)(void* ctx, int device, size_t size, uint64_t* va);
  stash_status_t (*va_free)(void* ctx, int device, uint64_t va, size_t size);
  stash_status_t (*phys_create)(void* ctx, int device, size_t size, uint64_t* handle);
  stash_status_t (*phys_release)(void* ctx, int device, uint64_t handle);
  stash_status_t (*map)(void* ctx, int device, uint64_t va, size_t size, uint64_t handle,
                        size_t offset);
  stash_status_t (*unmap)(void* ctx, int device, uint64_t va, size_t size);
  stash_status_t (*set_access)(void* ctx, int device, uint64_t va, size_t size);

  /* Events and streams (required). event_query returns STASH_OK once the work recorded
   * before the event has completed, STASH_ERR_NOT_READY before. A NULL stream is the
   * device's default stream. */
  stash_status_t (*event_create)(void* ctx, int device, uint64_t* event);
  stash_status_t (*event_record)(void* ctx, int device, uint64_t event, void* stream);
  stash_status_t (*event_query)(void* ctx, uint64_t event);
  stash_status_t (*event_synchronize)(void* ctx, uint64_t event);
  stash_status_t (*event_destroy)(void* ctx, uint64_t event);
  stash_status_t (*stream_synchronize)(void* ctx, int device, void* stream);

  /* Version 2 (optional). stream_wait makes the work queued on `stream` after the call wait,
   * on the device, for `event` (recorded on another stream) to complete; the host does not
   * wait. policy:stash uses it to give one stream a block that another stream freed, rather
   * than grow the heap, when that block's last use there may still be running (as
   * cudaMallocAsync's pools do: cudaMemPoolReuseAllowInternalDependencies). NULL: the
   * provider cannot, and such a block waits for its event to complete on its own. */
  stash_status_t (*stream_wait)(void* ctx, int device, void* stream, uint64_t event);
};

/* For provider implementations: set the calling thread's error message (printf format)
 * and return status, so that `return stash_provider_error(STASH_ERR_DRIVER, ...)` reports
 * a driver failure with the driver's own name and text for it. */
STASH_API stash_status_t stash_provider_error(stash_status_t status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- The CUDA provider ------------------------------------------------------------------ */

/* The CUDA provider (process-wide, created on first call): the driver is loaded at run time
 * (libcuda.so.1), so this works in any program and answers STASH_ERR_UNSUPPORTED, with the
 * reason in stash_last_error(), where there is no driver or no GPU, or when stash was built
 * without the CUDA toolkit. Devices are the driver's ordinals; streams are CUstream /
 * cudaStream_t values. Thread-safe. */
STASH_API stash_status_t stash_cuda_provider(const stash_provider_t** out);

/* A CUDA stream (non-blocking) on `device`, for programs that have no CUDA runtime of their
 * own (stash-replay, the tests); destroy it with stash_cuda_stream_destroy. */
STASH_API stash_status_t stash_cuda_stream_create(int device, void** stream);
STASH_API stash_status_t stash_cuda_stream_destroy(void* stream);

/* ---- The simulated provider ------------------------------------------------------------ */

typedef struct stash_sim_s stash_sim_t;

#define STASH_SIM_DEFAULT_CAPACITY 150109880320ULL /* an H200, as cuMemGetInfo reports it */
#define STASH_SIM_DEFAULT_GRANULARITY (2ULL << 20)

/* Create a simulated provider with `devices` devices of `capacity` bytes each (0: the
 * default) and 2 MiB granularity. Addresses are deterministic: the same calls give the same
 * addresses. Streams are any void* values (each distinct value is a stream); the work
 * recorded on a stream completes only when stash_sim_complete() says so (or a synchronize
 * call waits for it). Thread-safe (one mutex). */
STASH_API stash_status_t stash_sim_create(int devices, size_t capacity, stash_sim_t** out);
STASH_API void stash_sim_destroy(stash_sim_t* sim);

/* The provider table of sim (its ctx is sim). */
STASH_API const stash_provider_t* stash_sim_provider(stash_sim_t* sim);

/* Complete all work queued so far on `stream`: events recorded on it become complete. */
STASH_API void stash_sim_complete(stash_sim_t* sim, void* stream);
/* The same for every stream at once (one lock: a replay calls it after every event). */
STASH_API void stash_sim_complete_all(stash_sim_t* sim);
/* Complete the work on `stream` up to `point`, a value stash_sim_stream_point gave earlier:
 * the work queued on it up to then, and what that work waited for - a GPU behind the host
 * (stash-replay --lag). The simulation tells a stream's work apart by its events: what was
 * queued after the point but before the stream's next event counts as before it; from that
 * event on, the work stays pending. A point past the work queued so far completes all of it;
 * 0 (an untracked stream's point) does nothing. */
STASH_API void stash_sim_complete_to(stash_sim_t* sim, void* stream, uint64_t point);

/* For checking that memory one stream freed reaches another only once that is safe: the
 * point in `stream`'s work that everything queued on it so far ends at (0 if the stream
 * cannot be tracked: out of host memory), and whether the work queued on stream `later` from
 * now on runs after `stream`'s work up to `point` - because that work has completed, or
 * `later` waits (stream_wait) for an event recorded on `stream` after it, or for an event of
 * a stream whose work up to that event waits so, in turn (CUDA orders a chain of waits). */
STASH_API uint64_t stash_sim_stream_point(stash_sim_t* sim, void* stream);
STASH_API bool stash_sim_ordered_after(stash_sim_t* sim, void* stream, uint64_t point,
                                       void* later);

/* Until called again with 0: mem_alloc places each allocation at addr when that range is
 * free on the simulated device and outside its virtual-address region (else as the driver
 * would). For replaying a traced program's own driver layout: PyTorch breaks ties between
 * equally good free blocks by address, and a training process's cudaMalloc addresses follow
 * no layout the simulation can predict (other allocations of the process come and go). */
STASH_API void stash_sim_place_at(stash_sim_t* sim, uint64_t addr);

/* Calls made so far of one kind (STASH_CALL_ANY: all kinds). */
STASH_API uint64_t stash_sim_calls(const stash_sim_t* sim, stash_provider_call_t call);
STASH_API void stash_sim_reset_calls(stash_sim_t* sim);

/* Fault injection. fail_nth: the n-th call (1-based, counted from now) of kind `call`
 * (STASH_CALL_ANY: of any kind) fails with `status`, once; n = 0 cancels.
 * fail_random: from now on each call of kind `call` (or any) fails with probability p,
 * drawn from a generator seeded with `seed`; p = 0 cancels. A failing call changes nothing
 * in the simulated device. */
STASH_API void stash_sim_fail_nth(stash_sim_t* sim, stash_provider_call_t call, uint64_t n,
                                  stash_status_t status);
STASH_API void stash_sim_fail_random(stash_sim_t* sim, stash_provider_call_t call, double p,
                                     uint64_t seed, stash_status_t status);
/* The modelled driver time of the calls so far, in microseconds: each call costs what it
 * was measured to cost on an H200 (cuMemAlloc 31-61 us by size, cuMemCreate 7.3-13,
 * cuMemMap 0.6, cuMemSetAccess about 18.5 per separately mapped piece in the range,
 * cuMemUnmap about 12.5 per piece, ...; the table is in provider_sim.c and
 * docs/driver-costs.md). */
STASH_API double stash_sim_modeled_us(const stash_sim_t* sim);
/* The same for one kind of call (STASH_CALL_ANY: all). */
STASH_API double stash_sim_modeled_us_of(const stash_sim_t* sim, stash_provider_call_t call);

/* Until called again (fn NULL: no more), fn(arg, call, bytes, us) after every call that
 * succeeds: its kind, the bytes it was about (the size mapped, made accessible, created,
 * reserved, ...; 0 for calls about no memory: events, streams, mem_info) and the microseconds
 * stash_sim_modeled_us charged it - one call's share of that figure, so that a caller can
 * say which of its own operations the modelled driver time went to (stash-replay --calls).
 * fn runs under the simulator's lock, on the thread that made the call: it must not call
 * the simulator. */
typedef void (*stash_sim_call_fn)(void* arg, stash_provider_call_t call, uint64_t bytes,
                                  double us);
STASH_API void stash_sim_on_call(stash_sim_t* sim, stash_sim_call_fn fn, void* arg);

/* Number of calls failed by injection so far. */
STASH_API uint64_t stash_sim_injected(const stash_sim_t* sim);

/* What the simulated device holds now: for leak checks. */
typedef struct stash_sim_usage_s {
  size_t used_bytes;     /* device memory in use (allocations and physical pages) */
  size_t allocations;    /* live mem_alloc allocations */
  size_t reservations;   /* live va_reserve ranges */
  size_t handles;        /* live physical allocations */
  size_t mapped_pages;   /* mapped granularity pages */
  size_t events;         /* live events */
} stash_sim_usage_t;
STASH_API void stash_sim_usage(const stash_sim_t* sim, int device, stash_sim_usage_t* out);

/* Whether [ptr, ptr+size) lies inside one live allocation or mapped, accessible pages of
 * `device`: true when the memory is usable. */
STASH_API bool stash_sim_is_usable(const stash_sim_t* sim, int device, uint64_t ptr,
                                   size_t size);

/* The memory behind ptr on `device`: stores in *phys an identifier of the physical byte at
 * ptr (the same byte mapped at two addresses has the same identifier; identifiers of one
 * run are consecutive) and returns how many bytes from ptr, at most size, continue that
 * physical memory and are usable; 0 when ptr is not usable memory. For checking that live
 * allocations share no memory, however it is mapped. */
STASH_API size_t stash_sim_translate(const stash_sim_t* sim, int device, uint64_t ptr,
                                     size_t size, uint64_t* phys);

#ifdef __cplusplus
}
#endif
#endif /* STASH_PROVIDER_H */
