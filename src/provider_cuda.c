/* provider_cuda.c: the CUDA provider - real GPUs, through the driver loaded at run time.
 *
 * This is the only file that includes cuda.h. The driver is opened with
 * dlopen("libcuda.so.1"); only cuGetProcAddress comes from dlsym, and every other entry
 * point is resolved through it at a pinned ABI version (the X-list below), as NCCL's
 * cudawrap and PyTorch's driver_api do: a newer driver then cannot hand us a newer
 * function with different behaviour. libstash links neither libcuda nor libcudart, so the
 * same library runs its simulated provider where there is no GPU and no driver, and this
 * provider answers there with a clear error.
 *
 * Contexts: each device's primary context is retained once, on first use, and made
 * current around the calls that need one (memory, its info) only when it is not current
 * already - so the provider works inside programs that use the runtime API (PyTorch,
 * CuPy: the runtime uses the same primary context) and in plain C programs that never
 * touched CUDA.
 *
 * Errors: CUDA_ERROR_OUT_OF_MEMORY is STASH_ERR_OOM (the heap then frees its cache and
 * retries); any other driver error is STASH_ERR_DRIVER with the driver's name and text for
 * it, set through stash_provider_error().
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* name, ABI version: every entry point the provider (and its tests) use. */
#define STASH_CU_SYMBOLS(X)            \
  X(cuInit, 2000)                      \
  X(cuDriverGetVersion, 2020)          \
  X(cuGetErrorName, 6000)              \
  X(cuGetErrorString, 6000)            \
  X(cuDeviceGetCount, 2000)            \
  X(cuDeviceGet, 2000)                 \
  X(cuDeviceGetAttribute, 2000)        \
  X(cuDevicePrimaryCtxRetain, 7000)    \
  X(cuDevicePrimaryCtxRelease, 11000)  \
  X(cuCtxGetCurrent, 4000)             \
  X(cuCtxPushCurrent, 4000)            \
  X(cuCtxPopCurrent, 4000)             \
  X(cuCtxSynchronize, 2000)            \
  X(cuMemGetInfo, 3020)                \
  X(cuMemAlloc, 3020)                  \
  X(cuMemFree, 3020)                   \
  X(cuMemGetAllocationGranularity, 10020) \
  X(cuMemAddressReserve, 10020)        \
  X(cuMemAddressFree, 10020)           \
  X(cuMemCreate, 10020)                \
  X(cuMemRelease, 10020)               \
  X(cuMemMap, 10020)                   \
  X(cuMemUnmap, 10020)                 \
  X(cuMemSetAccess, 10020)             \
  X(cuEventCreate, 2000)               \
  X(cuEventRecord, 2000)               \
  X(cuEventQuery, 2000)                \
  X(cuEventSynchronize, 2000)          \
  X(cuEventDestroy, 4000)              \
  X(cuStreamSynchronize, 2000)         \
  X(cuStreamCreate, 2000)              \
  X(cuStreamDestroy, 4000)             \
  X(cuStreamQuery, 2000)               \
  X(cuStreamWaitEvent, 3020)           \
  X(cuMemsetD32Async, 3020)            \
  X(cuMemcpyDtoH, 3020)                \
  X(cuThreadExchangeStreamCaptureMode, 10010)

typedef struct cu_api_s {
#define STASH_X_(name, ver) PFN_##name##_v##ver name;
  STASH_CU_SYMBOLS(STASH_X_)
#undef STASH_X_
} cu_api_t;

#define MAX_DEVICES 64

typedef struct cuda_provider_s {
  stash_provider_t table;
  void* lib;
  cu_api_t cu;
  int driver_version;
  int ndevices;
  pthread_mutex_t ctx_lock; /* guards the contexts' creation */
  CUcontext ctx[MAX_DEVICES];  /* retained primary contexts (NULL: not yet) */
  size_t granularity[MAX_DEVICES];
} cuda_provider_t;

static cuda_provider_t g_cuda;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static stash_status_t g_init_status;
static char g_init_error[512];

/* ---- Errors ------------------------------------------------------------------------------ */

static stash_status_t cu_fail(CUresult r, const char* call) {
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return stash_provider_error(STASH_ERR_OOM, "%s: CUDA_ERROR_OUT_OF_MEMORY (out of memory)",
                                call);
  const char* name = NULL;
  const char* text = NULL;
  if (g_cuda.cu.cuGetErrorName) g_cuda.cu.cuGetErrorName(r, &name);
  if (g_cuda.cu.cuGetErrorString) g_cuda.cu.cuGetErrorString(r, &text);
  return stash_provider_error(STASH_ERR_DRIVER, "%s: %s (%s)", call,
                              name ? name : "CUDA_ERROR_UNKNOWN", text ? text : "no text");
}

#define CU(call, args)                          \
  do {                                          \
    CUresult r_ = g_cuda.cu.call args;          \
    if (r_ != CUDA_SUCCESS) return cu_fail(r_, #call); \
  } while (0)

/* ---- Loading the driver -------------------------------------------------------------------- */

static void load_driver(void) {
  cuda_provider_t* p = &g_cuda;
  g_init_status = STASH_ERR_UNSUPPORTED;
  p->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!p->lib) {
    snprintf(g_init_error, sizeof g_init_error,
             "no CUDA driver: libcuda.so.1 could not be loaded (%s)", dlerror());
    return;
  }
  PFN_cuGetProcAddress_v12000 get_proc =
      (PFN_cuGetProcAddress_v12000)dlsym(p->lib, "cuGetProcAddress_v2");
  if (!get_proc) {
    snprintf(g_init_error, sizeof g_init_error,
             "the CUDA driver is too old: it has no cuGetProcAddress_v2 (CUDA 12 or newer is "
             "needed)");
    return;
  }
#define STASH_X_(name, ver)                                                                    \
  {                                                                                            \
    CUdriverProcAddressQueryResult found_;                                                     \
    CUresult r_ = get_proc(#name, (void**)&p->cu.name, ver, CU_GET_PROC_ADDRESS_LEGACY_STREAM, \
                           &found_);                                                           \
    if (r_ != CUDA_SUCCESS || !p->cu.name) {                                                   \
      snprintf(g_init_error, sizeof g_init_error,                                              \
               "the CUDA driver has no %s (ABI version %d): error %d, query result %d", #name, \
               ver, (int)r_, (int)found_);                                                     \
      return;                                                                                  \
    }                                                                                          \
  }
  STASH_CU_SYMBOLS(STASH_X_)
#undef STASH_X_
  CUresult r = p->cu.cuInit(0);
  if (r != CUDA_SUCCESS) {
    cu_fail(r, "cuInit");
    snprintf(g_init_error, sizeof g_init_error, "the CUDA driver did not start: %s",
             _stash_provider_message());
    return;
  }
  p->cu.cuDriverGetVersion(&p->driver_version);
  int n = 0;
  r = p->cu.cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS || n < 1) {
    snprintf(g_init_error, sizeof g_init_error, "the CUDA driver sees no GPU (error %d)", (int)r);
    return;
  }
  p->ndevices = n < MAX_DEVICES ? n : MAX_DEVICES;
  pthread_mutex_init(&p->ctx_lock, NULL);
  g_init_status = STASH_OK;
}

/* The device's primary context, retained once. */
static stash_status_t device_ctx(int device, CUcontext* out) {
  cuda_provider_t* p = &g_cuda;
  if (device < 0 || device >= p->ndevices)
    return stash_provider_error(STASH_ERR_INVALID, "cuda: no device %d (%d devices)", device,
                                p->ndevices);
  CUcontext c = __atomic_load_n(&p->ctx[device], __ATOMIC_ACQUIRE);
  if (c) {
    *out = c;
    return STASH_OK;
  }
  pthread_mutex_lock(&p->ctx_lock);
  c = p->ctx[device];
  stash_status_t st = STASH_OK;
  if (!c) {
    CUdevice dev;
    CUresult r = p->cu.cuDeviceGet(&dev, device);
    if (r == CUDA_SUCCESS) r = p->cu.cuDevicePrimaryCtxRetain(&c, dev);
    if (r != CUDA_SUCCESS) {
      st = cu_fail(r, "cuDevicePrimaryCtxRetain");
    } else {
      __atomic_store_n(&p->ctx[device], c, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&p->ctx_lock);
  *out = c;
  return st;
}

/* Make the device's context current for a call; *pushed says whether to pop after. */
static stash_status_t enter_ctx(int device, bool* pushed) {
  CUcontext want, cur = NULL;
  *pushed = false;
  stash_status_t st = device_ctx(device, &want);
  if (st != STASH_OK) return st;
  CU(cuCtxGetCurrent, (&cur));
  if (cur == want) return STASH_OK;
  CU(cuCtxPushCurrent, (want));
  *pushed = true;
  return STASH_OK;
}

static void leave_ctx(bool pushed) {
  if (pushed) {
    CUcontext c;
    g_cuda.cu.cuCtxPopCurrent(&c);
  }
}

/* Run `body` (which sets r) with the device's context current. */
#define IN_CTX(device, body)                      \
  do {                                            \
    bool pushed_;                                 \
    stash_status_t st_ = enter_ctx(device, &pushed_); \
    if (st_ != STASH_OK) return st_;              \
    CUresult r = CUDA_SUCCESS;                    \
    body;                                         \
    leave_ctx(pushed_);                           \
    if (r != CUDA_SUCCESS) return cu_fail(r, call_); \
  } while (0)

/* The same with the calling thread's stream-capture mode relaxed for the call: while any
 * stream is being captured into a CUDA graph in the default (global) mode, the driver refuses
 * "potentially unsafe" calls - cuMemAlloc among them, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED -
 * from every thread, and PyTorch's torch.cuda.graph captures in that mode. The memory calls
 * enqueue nothing on a stream; PyTorch's own allocator relaxes the mode around its cudaMalloc
 * the same way. */
#define IN_CTX_RELAXED(device, body)                                   \
  IN_CTX(device, {                                                     \
    CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;        \
    g_cuda.cu.cuThreadExchangeStreamCaptureMode(&mode_);               \
    body;                                                              \
    g_cuda.cu.cuThreadExchangeStreamCaptureMode(&mode_);               \
  })

/* ---- The provider functions ---------------------------------------------------------------- */

static stash_status_t cuda_device_count(void* ctx, int* count) {
  (void)ctx;
  *count = g_cuda.ndevices;
  return STASH_OK;
}

static void page_prop(int device, CUmemAllocationProp* prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = device;
}

static stash_status_t cuda_granularity(void* ctx, int device, size_t* bytes) {
  (void)ctx;
  if (device < 0 || device >= g_cuda.ndevices)
    return stash_provider_error(STASH_ERR_INVALID, "cuda: no device %d", device);
  if (!g_cuda.granularity[device]) {
    CUmemAllocationProp prop;
    page_prop(device, &prop);
    size_t g = 0;
    const char* call_ = "cuMemGetAllocationGranularity";
    IN_CTX(device, r = g_cuda.cu.cuMemGetAllocationGranularity(
                       &g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    g_cuda.granularity[device] = g;
  }
  *bytes = g_cuda.granularity[device];
  return STASH_OK;
}

static stash_status_t cuda_mem_info(void* ctx, int device, size_t* free_bytes, size_t* total) {
  (void)ctx;
  const char* call_ = "cuMemGetInfo";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemGetInfo(free_bytes, total));
  return STASH_OK;
}

static stash_status_t cuda_mem_alloc(void* ctx, int device, size_t size, uint64_t* ptr) {
  (void)ctx;
  CUdeviceptr d = 0;
  const char* call_ = "cuMemAlloc";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemAlloc(&d, size));
  *ptr = (uint64_t)d;
  return STASH_OK;
}

static stash_status_t cuda_mem_free(void* ctx, int device, uint64_t ptr, size_t size) {
  (void)ctx;
  (void)size;
  const char* call_ = "cuMemFree";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemFree((CUdeviceptr)ptr));
  return STASH_OK;
}

static stash_status_t cuda_va_reserve(void* ctx, int device, size_t size, uint64_t* va) {
  (void)ctx;
  CUdeviceptr d = 0;
  const char* call_ = "cuMemAddressReserve";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemAddressReserve(&d, size, 0, 0, 0));
  *va = (uint64_t)d;
  return STASH_OK;
}

static stash_status_t cuda_va_free(void* ctx, int device, uint64_t va, size_t size) {
  (void)ctx;
  const char* call_ = "cuMemAddressFree";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemAddressFree((CUdeviceptr)va, size));
  return STASH_OK;
}

static stash_status_t cuda_phys_create(void* ctx, int device, size_t size, uint64_t* handle) {
  (void)ctx;
  CUmemAllocationProp prop;
  page_prop(device, &prop);
  CUmemGenericAllocationHandle h = 0;
  const char* call_ = "cuMemCreate";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemCreate(&h, size, &prop, 0));
  *handle = (uint64_t)h;
  return STASH_OK;
}

static stash_status_t cuda_phys_release(void* ctx, int device, uint64_t handle) {
  (void)ctx;
  const char* call_ = "cuMemRelease";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemRelease((CUmemGenericAllocationHandle)handle));
  return STASH_OK;
}

static stash_status_t cuda_map(void* ctx, int device, uint64_t va, size_t size,
                               uint64_t handle, size_t offset) {
  (void)ctx;
  const char* call_ = "cuMemMap";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemMap((CUdeviceptr)va, size, offset,
                                        (CUmemGenericAllocationHandle)handle, 0));
  return STASH_OK;
}

static stash_status_t cuda_unmap(void* ctx, int device, uint64_t va, size_t size) {
  (void)ctx;
  const char* call_ = "cuMemUnmap";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemUnmap((CUdeviceptr)va, size));
  return STASH_OK;
}

static stash_status_t cuda_set_access(void* ctx, int device, uint64_t va, size_t size) {
  (void)ctx;
  CUmemAccessDesc desc;
  memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const char* call_ = "cuMemSetAccess";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuMemSetAccess((CUdeviceptr)va, size, &desc, 1));
  return STASH_OK;
}

static stash_status_t cuda_event_create(void* ctx, int device, uint64_t* event) {
  (void)ctx;
  CUevent e = NULL;
  const char* call_ = "cuEventCreate";
  IN_CTX_RELAXED(device, r = g_cuda.cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  *event = (uint64_t)(uintptr_t)e;
  return STASH_OK;
}

/* Events and streams carry their context: these calls need no current context. */
static stash_status_t cuda_event_record(void* ctx, int device, uint64_t event, void* stream) {
  (void)ctx;
  if (stream == NULL) { /* the legacy default stream is named by the current context */
    const char* call_ = "cuEventRecord";
    IN_CTX(device, r = g_cuda.cu.cuEventRecord((CUevent)(uintptr_t)event, NULL));
    return STASH_OK;
  }
  CU(cuEventRecord, ((CUevent)(uintptr_t)event, (CUstream)stream));
  return STASH_OK;
}

static stash_status_t cuda_event_query(void* ctx, uint64_t event) {
  (void)ctx;
  CUresult r = g_cuda.cu.cuEventQuery((CUevent)(uintptr_t)event);
  if (r == CUDA_SUCCESS) return STASH_OK;
  if (r == CUDA_ERROR_NOT_READY) return STASH_ERR_NOT_READY;
  return cu_fail(r, "cuEventQuery");
}

static stash_status_t cuda_event_synchronize(void* ctx, uint64_t event) {
  (void)ctx;
  CU(cuEventSynchronize, ((CUevent)(uintptr_t)event));
  return STASH_OK;
}

static stash_status_t cuda_event_destroy(void* ctx, uint64_t event) {
  (void)ctx;
  CU(cuEventDestroy, ((CUevent)(uintptr_t)event));
  return STASH_OK;
}

static stash_status_t cuda_stream_synchronize(void* ctx, int device, void* stream) {
  (void)ctx;
  if (stream == NULL) {
    const char* call_ = "cuStreamSynchronize";
    IN_CTX(device, r = g_cuda.cu.cuStreamSynchronize(NULL));
    return STASH_OK;
  }
  CU(cuStreamSynchronize, ((CUstream)stream));
  return STASH_OK;
}

static stash_status_t cuda_stream_wait(void* ctx, int device, void* stream, uint64_t event) {
  (void)ctx;
  if (stream == NULL) { /* the legacy default stream is named by the current context */
    const char* call_ = "cuStreamWaitEvent";
    IN_CTX(device, r = g_cuda.cu.cuStreamWaitEvent(NULL, (CUevent)(uintptr_t)event, 0));
    return STASH_OK;
  }
  CU(cuStreamWaitEvent, ((CUstream)stream, (CUevent)(uintptr_t)event, 0));
  return STASH_OK;
}

static void fill_table(void) {
  stash_provider_t* t = &g_cuda.table;
  t->version = STASH_PROVIDER_VERSION;
  t->size = sizeof *t;
  t->name = "cuda";
  t->ctx = &g_cuda;
  t->device_count = cuda_device_count;
  t->granularity = cuda_granularity;
  t->mem_info = cuda_mem_info;
  t->mem_alloc = cuda_mem_alloc;
  t->mem_free = cuda_mem_free;
  t->va_reserve = cuda_va_reserve;
  t->va_free = cuda_va_free;
  t->phys_create = cuda_phys_create;
  t->phys_release = cuda_phys_release;
  t->map = cuda_map;
  t->unmap = cuda_unmap;
  t->set_access = cuda_set_access;
  t->event_create = cuda_event_create;
  t->event_record = cuda_event_record;
  t->event_query = cuda_event_query;
  t->event_synchronize = cuda_event_synchronize;
  t->event_destroy = cuda_event_destroy;
  t->stream_synchronize = cuda_stream_synchronize;
  t->stream_wait = cuda_stream_wait;
}

static void init_once(void) {
  load_driver();
  if (g_init_status == STASH_OK) fill_table();
}

stash_status_t stash_cuda_provider(const stash_provider_t** out) {
  if (!out) return _stash_error(STASH_ERR_INVALID, "stash_cuda_provider: out is NULL");
  *out = NULL;
  pthread_once(&g_once, init_once);
  if (g_init_status != STASH_OK) return _stash_error(g_init_status, "cuda: %s", g_init_error);
  *out = &g_cuda.table;
  return STASH_OK;
}

stash_status_t stash_cuda_stream_create(int device, void** stream) {
  if (!stream) return _stash_error(STASH_ERR_INVALID, "stash_cuda_stream_create: stream is NULL");
  *stream = NULL;
  pthread_once(&g_once, init_once);
  if (g_init_status != STASH_OK) return _stash_error(g_init_status, "cuda: %s", g_init_error);
  CUstream s = NULL;
  const char* call_ = "cuStreamCreate";
  stash_status_t st = STASH_OK;
  {
    bool pushed_;
    st = enter_ctx(device, &pushed_);
    if (st != STASH_OK) return _stash_error(st, "stash_cuda_stream_create: %s", _stash_provider_message());
    CUresult r = g_cuda.cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    leave_ctx(pushed_);
    if (r != CUDA_SUCCESS) {
      cu_fail(r, call_);
      return _stash_error(STASH_ERR_DRIVER, "stash_cuda_stream_create: %s", _stash_provider_message());
    }
  }
  *stream = s;
  return STASH_OK;
}

stash_status_t stash_cuda_stream_destroy(void* stream) {
  pthread_once(&g_once, init_once);
  if (g_init_status != STASH_OK) return _stash_error(g_init_status, "cuda: %s", g_init_error);
  CUresult r = g_cuda.cu.cuStreamDestroy((CUstream)stream);
  if (r != CUDA_SUCCESS) {
    cu_fail(r, "cuStreamDestroy");
    return _stash_error(STASH_ERR_DRIVER, "stash_cuda_stream_destroy: %s", _stash_provider_message());
  }
  return STASH_OK;
}

void* _stash_cuda_symbol(const char* name) {
  pthread_once(&g_once, init_once);
  if (g_init_status != STASH_OK) return NULL;
#define STASH_X_(sym, ver) \
  if (strcmp(name, #sym) == 0) return (void*)g_cuda.cu.sym;
  STASH_CU_SYMBOLS(STASH_X_)
#undef STASH_X_
  return NULL;
}

int _stash_cuda_context_current(int device) {
  CUcontext c;
  if (pthread_once(&g_once, init_once) != 0 || g_init_status != STASH_OK) return -1;
  if (device_ctx(device, &c) != STASH_OK) return -1;
  CUcontext cur = NULL;
  g_cuda.cu.cuCtxGetCurrent(&cur);
  if (cur != c && g_cuda.cu.cuCtxPushCurrent(c) != CUDA_SUCCESS) return -1;
  return 0;
}
