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
 * python/stash adds to the exception.
 *
 * CUDA graphs' private pools. A graph replays its kernels at the addresses its capture got,
 * so the memory of every allocation made while it was captured must stay its own - not be
 * handed to an allocation outside the capture, nor given back by empty_cache - until the
 * graph is destroyed. PyTorch brackets a capture with beginAllocateToPool and
 * endAllocateToPool and calls releasePool when a graph using the pool goes; the hooks here
 * give each pool its own heap, made like the device's default heap (the same STASH_CONF and
 * provider). While a pool is open on a device, every allocation on that device comes from
 * it (PyTorch asks only the capturing streams' allocations of it, through a C++ filter this C
 * library cannot call; taking the others too is safe, and a capture is brief); a block
 * freed returns to the heap it came from, whenever it is freed. Once every graph using a
 * pool has released it and its last block is freed, the next empty_cache gives its memory
 * back and destroys its heap (as PyTorch frees a released pool's blocks there). While a
 * capture is underway the device's heaps record and query no event (stash_heap_capture_begin):
 * a capture on several streams frees blocks used on more than one. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "internal.h"
#include "stash_plugins.h"

#define MAX_HEAPS 64

static stash_heap_t* heap_of(int device) {
  stash_heap_t* h = NULL;
  return stash_default_heap(device, &h) == STASH_OK ? h : NULL;
}

/* ---- CUDA graphs' private pools --------------------------------------------------------- */

typedef struct graph_pool_s {
  int device;
  uint64_t id[2];      /* PyTorch's MempoolId_t */
  stash_heap_t* heap;
  int uses;            /* begun captures (or MemPool uses) not yet released */
  uint64_t opened;     /* while open (begun, not ended): when it was begun; 0 when closed */
  size_t live;         /* blocks allocated from it and not yet freed */
} graph_pool_t;

static pthread_mutex_t g_pools_lock = PTHREAD_MUTEX_INITIALIZER;
static graph_pool_t* g_pools;
static size_t g_npools, g_cap_pools;
static uint64_t g_open_clock;
static int g_capturing[MAX_HEAPS]; /* captures underway per device (begun, not ended) */
static ptrmap_t g_pool_blocks; /* block address -> its pool's heap */
static atomic_int g_open_pools;   /* pools open now, on any device: 0 on the fast path */
static atomic_size_t g_pool_live; /* blocks of any pool live now: 0 on the fast path */

static graph_pool_t* pool_find(int device, uint64_t id0, uint64_t id1) {
  for (size_t i = 0; i < g_npools; i++)
    if (g_pools[i].device == device && g_pools[i].id[0] == id0 && g_pools[i].id[1] == id1)
      return &g_pools[i];
  return NULL;
}

static graph_pool_t* pool_of_heap(const stash_heap_t* h) {
  for (size_t i = 0; i < g_npools; i++)
    if (g_pools[i].heap == h) return &g_pools[i];
  return NULL;
}

/* The pool that allocations on `device` go to now: the open one begun last. */
static graph_pool_t* pool_open_on(int device) {
  graph_pool_t* best = NULL;
  for (size_t i = 0; i < g_npools; i++)
    if (g_pools[i].device == device && g_pools[i].opened &&
        (!best || g_pools[i].opened > best->opened))
      best = &g_pools[i];
  return best;
}

/* Give back the pools that every graph has released and whose blocks are all freed, as
 * PyTorch does at empty_cache: each heap waits for the work its blocks were used by, gives
 * its memory back and is destroyed. */
static void pools_release_freeable(void) {
  for (size_t i = 0; i < g_npools;) {
    graph_pool_t* p = &g_pools[i];
    if (p->uses > 0 || p->live > 0 || p->opened) {
      i++;
      continue;
    }
    if (stash_heap_empty_cache(p->heap) != STASH_OK) /* the wait failed: destroy gives it back */
      fprintf(stderr, "stash: waiting for a CUDA graph pool's work: %s\n", stash_last_error());
    if (stash_heap_destroy(p->heap) != STASH_OK)
      fprintf(stderr, "stash: giving back a CUDA graph pool: %s\n", stash_last_error());
    *p = g_pools[--g_npools];
  }
}

/* Tell the device's heaps - its default heap and every pool's - that a capture begins
 * (delta 1) or ends (-1): no event is recorded or queried while one is underway. */
static void heaps_capturing(int device, int delta) {
  stash_heap_t* d = heap_of(device);
  if (d) (delta > 0 ? stash_heap_capture_begin : stash_heap_capture_end)(d);
  for (size_t i = 0; i < g_npools; i++)
    if (g_pools[i].device == device)
      (delta > 0 ? stash_heap_capture_begin : stash_heap_capture_end)(g_pools[i].heap);
}

void stash_torch_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1, void* filter) {
  (void)filter; /* a C++ std::function: every allocation on the device goes to the pool */
  if (device < 0 || device >= MAX_HEAPS) return;
  pthread_mutex_lock(&g_pools_lock);
  graph_pool_t* p = pool_find(device, id0, id1);
  if (!p) {
    stash_heap_t* h = NULL;
    graph_pool_t* v = _stash_array_grow(g_pools, &g_cap_pools, g_npools + 1, sizeof *v, 4);
    stash_status_t st = v ? STASH_OK : _stash_error(STASH_ERR_HOST_OOM, "out of host memory");
    if (v) g_pools = v;
    if (st == STASH_OK) st = _stash_default_heap_sibling(device, &h);
    if (st != STASH_OK) {
      pthread_mutex_unlock(&g_pools_lock);
      /* PyTorch cannot be told, and a capture into the shared cache is unsafe */
      fprintf(stderr, "stash: cannot make a private pool for a CUDA graph on device %d: %s\n",
              device, stash_last_error());
      abort();
    }
    for (int k = 0; k < g_capturing[device]; k++) stash_heap_capture_begin(h); /* others' */
    p = &g_pools[g_npools++];
    *p = (graph_pool_t){device, {id0, id1}, h, 0, 0, 0};
  }
  p->uses++;
  if (!p->opened) { /* (begun again before its end: the same capture) */
    atomic_fetch_add(&g_open_pools, 1);
    g_capturing[device]++;
    heaps_capturing(device, 1);
  }
  p->opened = ++g_open_clock;
  pthread_mutex_unlock(&g_pools_lock);
}

void stash_torch_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1) {
  pthread_mutex_lock(&g_pools_lock);
  graph_pool_t* p = pool_find(device, id0, id1);
  if (p && p->opened) {
    p->opened = 0;
    atomic_fetch_sub(&g_open_pools, 1);
    g_capturing[device]--;
    heaps_capturing(device, -1);
  }
  pthread_mutex_unlock(&g_pools_lock);
}

void stash_torch_release_pool(int device, uint64_t id0, uint64_t id1) {
  pthread_mutex_lock(&g_pools_lock);
  graph_pool_t* p = pool_find(device, id0, id1);
  if (p && p->uses > 0) p->uses--; /* its memory goes back at the next empty_cache */
  pthread_mutex_unlock(&g_pools_lock);
}

int stash_torch_pool_list(stash_heap_t** out, int max) {
  pthread_mutex_lock(&g_pools_lock);
  int n = (int)g_npools;
  for (int i = 0; out && i < n && i < max; i++) out[i] = g_pools[i].heap;
  pthread_mutex_unlock(&g_pools_lock);
  return n;
}

int stash_torch_pool_id(const stash_heap_t* heap, uint64_t* id0, uint64_t* id1) {
  pthread_mutex_lock(&g_pools_lock);
  const graph_pool_t* p = pool_of_heap(heap);
  if (p) {
    *id0 = p->id[0];
    *id1 = p->id[1];
  }
  pthread_mutex_unlock(&g_pools_lock);
  return p ? 0 : -1;
}

/* An allocation while a pool is open on the device: from the pool. false: none is open. */
static bool pool_alloc(size_t size, int device, void* stream, void** p, stash_status_t* st) {
  if (atomic_load(&g_open_pools) == 0) return false;
  pthread_mutex_lock(&g_pools_lock);
  graph_pool_t* pool = pool_open_on(device);
  if (!pool) {
    pthread_mutex_unlock(&g_pools_lock);
    return false;
  }
  *st = _stash_ptrmap_reserve(&g_pool_blocks, 1);
  if (*st != STASH_OK) *st = _stash_error(STASH_ERR_HOST_OOM, "out of host memory");
  if (*st == STASH_OK) *st = stash_heap_alloc(pool->heap, size, stream, p);
  if (*st == STASH_OK && *p) {
    _stash_ptrmap_put(&g_pool_blocks, (uint64_t)(uintptr_t)*p, pool->heap); /* reserved */
    pool->live++;
    atomic_fetch_add(&g_pool_live, 1);
  }
  pthread_mutex_unlock(&g_pools_lock);
  return true;
}

/* The free of a pool's block: to its heap (and the pool retired if that was its last). false:
 * not a pool's block. */
static bool pool_free(void* ptr) {
  if (atomic_load(&g_pool_live) == 0 || !ptr) return false;
  pthread_mutex_lock(&g_pools_lock);
  stash_heap_t* h = _stash_ptrmap_take(&g_pool_blocks, (uint64_t)(uintptr_t)ptr);
  if (h) {
    graph_pool_t* pool = pool_of_heap(h);
    if (stash_heap_free(h, ptr) != STASH_OK)
      fprintf(stderr, "stash: freeing %p of a CUDA graph pool: %s\n", ptr, stash_last_error());
    atomic_fetch_sub(&g_pool_live, 1);
    if (pool) pool->live--;
  }
  pthread_mutex_unlock(&g_pools_lock);
  return h != NULL;
}

/* The pool heap a live block belongs to, or NULL. */
static stash_heap_t* pool_heap_of(void* ptr) {
  if (atomic_load(&g_pool_live) == 0 || !ptr) return NULL;
  pthread_mutex_lock(&g_pools_lock);
  stash_heap_t* h = _stash_ptrmap_get(&g_pool_blocks, (uint64_t)(uintptr_t)ptr);
  pthread_mutex_unlock(&g_pools_lock);
  return h;
}

/* ---- PyTorch ------------------------------------------------------------------------------ */

/* PyTorch's plug-in interface has no way to report a failure: it wraps whatever malloc
 * returns, NULL included, in a tensor (PyTorch 2.11, measured on the H200), and the first
 * kernel to touch it faults. So a failure stops the process with the reason, unless
 * STASH_TORCH_NULL_ON_FAILURE is set (for callers that check the pointer themselves). */
void* stash_torch_malloc(ssize_t size, int device, void* stream) {
  void* p = NULL;
  stash_status_t st = STASH_OK;
  if (size < 0) {
    _stash_error(STASH_ERR_INVALID, "stash_torch_malloc: negative size %zd", size);
  } else if (pool_alloc((size_t)size, device, stream, &p, &st)) {
    if (st == STASH_OK) return p;
  } else {
    stash_heap_t* h = heap_of(device);
    if (h && stash_heap_alloc(h, (size_t)size, stream, &p) == STASH_OK) return p;
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
  if (pool_free(ptr)) return;
  stash_heap_t* h = heap_of(device);
  if (!h || stash_heap_free(h, ptr) != STASH_OK) {
    /* PyTorch has no way to hear of it: say it, once per failure, on stderr */
    fprintf(stderr, "stash: stash_torch_free(%p, device %d): %s\n", ptr, device,
            stash_last_error());
  }
}

/* Called once with the number of devices; the heaps are made on first use. */
void stash_torch_init(int device_count) { (void)device_count; }

/* torch.cuda.empty_cache(): every default heap gives back what it can; of the graph pools,
 * only those no graph uses any more and whose blocks are all freed (a pool's free memory is
 * where its graphs replay). */
void stash_torch_reset(void) {
  pthread_mutex_lock(&g_pools_lock);
  pools_release_freeable();
  pthread_mutex_unlock(&g_pools_lock);
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
  stash_heap_t* ph = pool_heap_of(ptr);
  if (ph) {
    if (stash_heap_record_stream(ph, ptr, stream) != STASH_OK)
      fprintf(stderr, "stash: record_stream(%p): %s\n", ptr, stash_last_error());
    return;
  }
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
