/* plugins.c: the C entry points that PyTorch's and CuPy's allocator plug-in points load,
 * over the process-wide default heaps (one per device, configured by STASH_CONF and
 * STASH_PROVIDER: default_heap.c).
 *
 * PyTorch: torch.cuda.memory.CUDAPluggableAllocator(libstash, "stash_torch_malloc",
 * "stash_torch_free"), and the optional hooks set through its allocator() object:
 * init, reset (torch.cuda.empty_cache), memory fraction, record_stream, base allocation.
 * CuPy: cupy.cuda.memory.CFunctionAllocator(0, stash_cupy_malloc, stash_cupy_free, owner).
 *
 * These functions cannot return a status: on failure malloc returns NULL (PyTorch and CuPy
 * then raise their out-of-memory error) and the reason is in stash_last_error(), which
 * python/stash adds to the exception. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "internal.h"
#include "stash_plugins.h"

#define MAX_HEAPS 64

static stash_heap_t* heap_of(int device) {
  stash_heap_t* h = NULL;
  return stash_default_heap(device, &h) == STASH_OK ? h : NULL;
}

/* PyTorch's plug-in interface has no way to report a failure: it wraps whatever malloc
 * returns, NULL included, in a tensor (PyTorch 2.11, measured on the H200), and the first
 * kernel to touch it faults. So a failure stops the process with the reason, unless
 * STASH_TORCH_NULL_ON_FAILURE is set (for callers that check the pointer themselves). */
void* stash_torch_malloc(ssize_t size, int device, void* stream) {
  stash_heap_t* h = heap_of(device);
  void* p = NULL;
  if (size < 0) {
    _stash_error(STASH_ERR_INVALID, "stash_torch_malloc: negative size %zd", size);
  } else if (h && stash_heap_alloc(h, (size_t)size, stream, &p) == STASH_OK) {
    return p;
  }
  if (size != 0 && !getenv("STASH_TORCH_NULL_ON_FAILURE")) {
    fprintf(stderr, "stash: PyTorch's allocation of %zd bytes on device %d failed and PyTorch "
            "cannot be told (its plug-in interface takes NULL as memory): %s\n", size, device,
            stash_last_error());
    abort();
  }
  return NULL;
}

void stash_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  (void)size;
  (void)stream;
  stash_heap_t* h = heap_of(device);
  if (!h || stash_heap_free(h, ptr) != STASH_OK) {
    /* PyTorch has no way to hear of it: say it, once per failure, on stderr */
    fprintf(stderr, "stash: stash_torch_free(%p, device %d): %s\n", ptr, device,
            stash_last_error());
  }
}

/* Called once with the number of devices; the heaps are made on first use. */
void stash_torch_init(int device_count) { (void)device_count; }

/* torch.cuda.empty_cache(): every default heap gives back what it can. */
void stash_torch_reset(void) {
  stash_heap_t* heaps[MAX_HEAPS];
  int n = stash_default_heap_list(heaps, MAX_HEAPS);
  if (n > MAX_HEAPS) n = MAX_HEAPS;
  for (int i = 0; i < n; i++) {
    if (stash_heap_empty_cache(heaps[i]) != STASH_OK)
      fprintf(stderr, "stash: empty_cache: %s\n", stash_last_error());
  }
}

void stash_torch_set_memory_fraction(double fraction, int device) {
  stash_heap_t* h = heap_of(device);
  if (!h || stash_heap_set_memory_fraction(h, fraction) != STASH_OK)
    fprintf(stderr, "stash: set_per_process_memory_fraction(%g, %d): %s\n", fraction, device,
            stash_last_error());
}

/* Tensor.record_stream: the block may belong to any device's heap. */
void stash_torch_record_stream(void* ptr, void* stream) {
  stash_heap_t* heaps[MAX_HEAPS];
  int n = stash_default_heap_list(heaps, MAX_HEAPS);
  if (n > MAX_HEAPS) n = MAX_HEAPS;
  for (int i = 0; i < n; i++) {
    stash_status_t st = stash_heap_record_stream(heaps[i], ptr, stream);
    if (st != STASH_ERR_BAD_POINTER) {
      if (st != STASH_OK) fprintf(stderr, "stash: record_stream(%p): %s\n", ptr, stash_last_error());
      return;
    }
  }
  fprintf(stderr, "stash: record_stream: %p is not a live stash allocation\n", ptr);
}

/* getBaseAllocation (IPC): each stash block is its own base (PyTorch's default). */
void* stash_torch_base_alloc(void* ptr, size_t* size) {
  (void)size;
  return ptr;
}

/* CuPy's CFunctionAllocator: malloc(param, size, device) and free(param, ptr, device), on
 * the device's default (legacy) stream. */
void* stash_cupy_malloc(void* param, size_t size, int device) {
  (void)param;
  stash_heap_t* h = heap_of(device);
  void* p = NULL;
  if (!h || stash_heap_alloc(h, size, NULL, &p) != STASH_OK) return NULL;
  return p;
}

void stash_cupy_free(void* param, void* ptr, int device) {
  (void)param;
  stash_torch_free(ptr, 0, device, NULL);
}
