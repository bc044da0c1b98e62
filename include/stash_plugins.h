/* stash_plugins.h: the entry points libstash exports for PyTorch's and CuPy's allocator
 * plug-in points, over the process-wide default heaps (one per device, configured by
 * STASH_CONF and STASH_PROVIDER when first used: see stash.h). python/stash installs them;
 * C and C++ programs may call them too. Streams are CUstream / cudaStream_t values. On
 * failure cupy_malloc returns NULL (CuPy raises its OutOfMemoryError) and stash_last_error()
 * says why; torch_malloc: see below; the other functions report failures on stderr (their
 * callers cannot take a status). Thread-safe. */
#ifndef STASH_PLUGINS_H
#define STASH_PLUGINS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "stash.h"

#ifdef __cplusplus
extern "C" {
#endif

/* torch.cuda.memory.CUDAPluggableAllocator(path, "stash_torch_malloc", "stash_torch_free").
 * PyTorch turns a NULL from malloc into a tensor at address 0 (it has no error channel), so
 * when an allocation fails (out of memory, a bad device) stash_torch_malloc prints the
 * reason and aborts the process - unless the environment sets STASH_TORCH_NULL_ON_FAILURE,
 * in which case it returns NULL. */
STASH_API void* stash_torch_malloc(ssize_t size, int device, void* stream);
STASH_API void stash_torch_free(void* ptr, ssize_t size, int device, void* stream);
/* Its optional hooks (allocator().set_init_fn, set_reset_fn, set_memory_fraction_fn,
 * set_record_stream_fn, set_base_alloc_fn). reset is torch.cuda.empty_cache(): every
 * default heap gives back what it can. base_alloc returns ptr itself (a block is its own
 * base, PyTorch's default). */
STASH_API void stash_torch_init(int device_count);
STASH_API void stash_torch_reset(void);
STASH_API void stash_torch_set_memory_fraction(double fraction, int device);
STASH_API void stash_torch_record_stream(void* ptr, void* stream);
STASH_API void* stash_torch_base_alloc(void* ptr, size_t* size);

/* CUDA graphs' private pools: allocator().set_begin_allocate_to_pool,
 * set_end_allocate_to_pool_fn and set_release_pool (PyTorch 2.3 and later), called by
 * torch.cuda.graph (and torch.cuda.MemPool) around a capture and when a graph is destroyed.
 * PyTorch passes a MempoolId_t (a pair of 64-bit integers, here id0 and id1) and, to begin,
 * a C++ filter of the streams whose allocations belong to the pool (by reference: `filter`,
 * unused). Between begin and end, every allocation on the device comes from the pool's own
 * heap (made like the default heap); a block returns to the heap it came from whenever it
 * is freed; once every graph using a pool has released it and its last block is freed, the
 * next empty_cache (stash_torch_reset) gives its memory back and destroys its heap, and
 * until then empty_cache leaves it alone. A pool
 * that cannot be made (out of memory, no driver) stops the process with the reason, as
 * stash_torch_malloc does: a capture into the shared cache would be overwritten. */
STASH_API void stash_torch_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1,
                                                  void* filter);
STASH_API void stash_torch_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1);
STASH_API void stash_torch_release_pool(int device, uint64_t id0, uint64_t id1);
/* The heaps of the pools that exist now, for statistics: their number; the first `max` in
 * out (NULL to count). A heap listed may be destroyed by a later empty_cache. */
STASH_API int stash_torch_pool_list(stash_heap_t** out, int max);
/* The MempoolId_t of the pool whose heap is `heap`: 0, or -1 when no pool has that heap. */
STASH_API int stash_torch_pool_id(const stash_heap_t* heap, uint64_t* id0, uint64_t* id1);

/* cupy.cuda.memory.CFunctionAllocator(0, stash_cupy_malloc, stash_cupy_free, owner): on
 * the device's default stream (CuPy does not pass its current stream). */
STASH_API void* stash_cupy_malloc(void* param, size_t size, int device);
STASH_API void stash_cupy_free(void* param, void* ptr, int device);

#ifdef __cplusplus
}
#endif
#endif /* STASH_PLUGINS_H */
