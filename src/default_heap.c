/* default_heap.c: the process-wide default heaps, one per device, configured from the
 * environment (STASH_CONF, STASH_PROVIDER, STASH_SIM_DEVICES, STASH_SIM_CAPACITY), for
 * programs that just want stash_malloc/stash_free.
 */
#include <errno.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "internal.h"

#define MAX_DEVICES 64

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* Written under g_lock; read without it on the fast path (a heap, once made, stays until
 * stash_default_shutdown, which must not race with users of the heaps). */
static _Atomic(stash_heap_t*) g_heaps[MAX_DEVICES];
static stash_sim_t* g_sim;
static const stash_provider_t* g_provider;
static int g_device_count;
static _Thread_local int tls_device;

/* Read a size in bytes with an optional K/M/G/T suffix (powers of 1024, "iB" allowed). */
static bool parse_env_size(const char* s, size_t* out) {
  char* end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  unsigned shift = 0;
  switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: break;
  }
  if (shift && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'B' || end[1] == 'b')) end += 2;
  else if (shift && (end[0] == 'B' || end[0] == 'b')) end += 1;
  if (*end) return false;
  if (shift && v > (SIZE_MAX >> shift)) return false;
  *out = (size_t)(v << shift);
  return true;
}

/* Create the shared provider on first use: STASH_PROVIDER=cuda or sim; unset, the CUDA
 * provider where a GPU is present and the simulated device elsewhere. Lock held. */
static stash_status_t ensure_provider(void) {
  if (g_provider) return STASH_OK;
  const char* name = getenv("STASH_PROVIDER");
  bool want_cuda = name && strcmp(name, "cuda") == 0;
  if (name && *name && !want_cuda && strcmp(name, "sim") != 0)
    return _stash_error(STASH_ERR_CONF, "STASH_PROVIDER: unknown provider '%s' (cuda, sim)",
                        name);
  if (want_cuda || !name || !*name) {
    const stash_provider_t* cuda = NULL;
    stash_status_t st = stash_cuda_provider(&cuda);
    if (st == STASH_OK) {
      int n = 0;
      cuda->device_count(cuda->ctx, &n);
      g_provider = cuda;
      g_device_count = n < MAX_DEVICES ? n : MAX_DEVICES;
      return STASH_OK;
    }
    if (want_cuda) return st; /* the reason is in stash_last_error() */
  }
  int devices = 1;
  const char* d = getenv("STASH_SIM_DEVICES");
  if (d && *d) {
    char* end;
    long v = strtol(d, &end, 10);
    if (*end || v < 1 || v > MAX_DEVICES)
      return _stash_error(STASH_ERR_CONF, "STASH_SIM_DEVICES: '%s' is not a number in 1..%d", d,
                          MAX_DEVICES);
    devices = (int)v;
  }
  size_t capacity = 0;
  const char* c = getenv("STASH_SIM_CAPACITY");
  if (c && *c && (!parse_env_size(c, &capacity) || capacity == 0))
    return _stash_error(STASH_ERR_CONF, "STASH_SIM_CAPACITY: '%s' is not a size (e.g. 80GiB)", c);
  stash_status_t st = stash_sim_create(devices, capacity, &g_sim);
  if (st != STASH_OK) return st;
  g_provider = stash_sim_provider(g_sim);
  g_device_count = devices;
  return STASH_OK;
}

stash_status_t stash_default_heap(int device, stash_heap_t** out) {
  if (!out) return _stash_error(STASH_ERR_INVALID, "stash_default_heap: out is NULL");
  *out = NULL;
  if (device >= 0 && device < MAX_DEVICES) { /* made already: no lock */
    stash_heap_t* h = atomic_load_explicit(&g_heaps[device], memory_order_acquire);
    if (h) {
      *out = h;
      return STASH_OK;
    }
  }
  pthread_mutex_lock(&g_lock);
  stash_status_t st = ensure_provider();
  if (st == STASH_OK && (device < 0 || device >= g_device_count)) {
    st = _stash_error(STASH_ERR_INVALID, "device %d does not exist (%d devices)", device,
                      g_device_count);
  }
  if (st == STASH_OK && !g_heaps[device]) {
    stash_conf_t conf;
    stash_conf_init(&conf);
    st = stash_conf_parse(&conf, getenv("STASH_CONF"));
    stash_heap_t* made = NULL;
    if (st == STASH_OK) st = stash_heap_create(&conf, g_provider, device, &made);
    if (st == STASH_OK) atomic_store_explicit(&g_heaps[device], made, memory_order_release);
  }
  if (st == STASH_OK) *out = g_heaps[device];
  pthread_mutex_unlock(&g_lock);
  return st;
}

stash_status_t _stash_default_heap_sibling(int device, stash_heap_t** out) {
  stash_heap_t* d = NULL;
  stash_status_t st = stash_default_heap(device, &d); /* the provider made, the device checked */
  if (st != STASH_OK) return st;
  stash_conf_t conf;
  stash_heap_conf(d, &conf);
  pthread_mutex_lock(&g_lock);
  st = stash_heap_create(&conf, g_provider, device, out);
  pthread_mutex_unlock(&g_lock);
  return st;
}

int stash_default_heap_list(stash_heap_t** out, int max) {
  int n = 0;
  pthread_mutex_lock(&g_lock);
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (!g_heaps[d]) continue;
    if (out && n < max) out[n] = g_heaps[d];
    n++;
  }
  pthread_mutex_unlock(&g_lock);
  return n;
}

stash_status_t stash_set_device(int device) {
  if (device < 0 || device >= MAX_DEVICES)
    return _stash_error(STASH_ERR_INVALID, "stash_set_device: device %d out of range", device);
  tls_device = device;
  return STASH_OK;
}

int stash_get_device(void) { return tls_device; }

void* stash_malloc(size_t size, void* stream) {
  stash_heap_t* h;
  if (stash_default_heap(tls_device, &h) != STASH_OK) return NULL;
  void* p = NULL;
  if (stash_heap_alloc(h, size, stream, &p) != STASH_OK) return NULL;
  return p;
}

void stash_free(void* ptr) {
  if (!ptr) return;
  /* The pointer may come from any device's heap: try the caller's first. */
  stash_heap_t* heaps[MAX_DEVICES];
  int n = 0;
  pthread_mutex_lock(&g_lock);
  if (tls_device < MAX_DEVICES && g_heaps[tls_device]) heaps[n++] = g_heaps[tls_device];
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (g_heaps[d] && d != tls_device) heaps[n++] = g_heaps[d];
  }
  pthread_mutex_unlock(&g_lock);
  for (int i = 0; i < n; i++) {
    if (stash_heap_free(heaps[i], ptr) != STASH_ERR_BAD_POINTER) return;
  }
  _stash_error(STASH_ERR_BAD_POINTER,
               "stash_free: %p is not a live allocation of any default heap", ptr);
}

void stash_default_shutdown(void) {
  pthread_mutex_lock(&g_lock);
  for (int d = 0; d < MAX_DEVICES; d++) {
    stash_heap_t* h = atomic_exchange(&g_heaps[d], NULL);
    if (h) stash_heap_destroy(h);
  }
  if (g_sim) stash_sim_destroy(g_sim);
  g_sim = NULL;
  g_provider = NULL;
  g_device_count = 0;
  pthread_mutex_unlock(&g_lock);
}
