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

/* cupy.cuda.memory.CFunctionAllocator(0, stash_cupy_malloc, stash_cupy_free, owner): on
 * the device's default stream (CuPy does not pass its current stream). */
STASH_API void* stash_cupy_malloc(void* param, size_t size, int device);
STASH_API void stash_cupy_free(void* param, void* ptr, int device);

#ifdef __cplusplus
}
#endif
#endif /* STASH_PLUGINS_H */
