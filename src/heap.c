/* heap.c: the public heap API - argument checks, the heap's lock, dispatch to the policy.
 *
 * Everything a policy needs from the outside world passes through here: the heap
 * validates its arguments, takes its mutex, and calls the policy's table; the policy
 * reaches the device only through the copied provider table.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const stash_policy_ops_t* policy_for(stash_policy_t p) {
  switch (p) {
    case STASH_POLICY_PYTORCH:
      return &_stash_policy_pytorch;
    case STASH_POLICY_STASH:
      return &_stash_policy_stash;
    default:
      return NULL;
  }
}

#define CHECK_HEAP(h, fn) \
  if (!(h)) return _stash_error(STASH_ERR_INVALID, "%s: heap is NULL", fn)

stash_status_t stash_heap_create(const stash_conf_t* conf, const stash_provider_t* provider,
                                 int device, stash_heap_t** out) {
  if (!out) return _stash_error(STASH_ERR_INVALID, "stash_heap_create: out is NULL");
  *out = NULL;
  stash_conf_t c;
  if (conf) c = *conf;
  else stash_conf_init(&c);
  stash_status_t st = _stash_conf_validate(&c);
  if (st != STASH_OK) return st;
  _stash_trace_start();

  stash_heap_t* h = calloc(1, sizeof *h);
  if (!h) return _stash_error(STASH_ERR_HOST_OOM, "stash_heap_create: out of host memory");
  st = _stash_provider_copy(&h->prov, provider);
  if (st != STASH_OK) goto fail;

  int count = 0;
  _stash_provider_message_clear();
  st = h->prov.device_count(h->prov.ctx, &count);
  if (st != STASH_OK) {
    st = _stash_error(st, "provider '%s': cannot count devices: %s", h->prov.name,
                      _stash_provider_message());
    goto fail;
  }
  if (device < 0 || device >= count) {
    st = _stash_error(STASH_ERR_INVALID, "stash_heap_create: device %d does not exist "
                      "(provider '%s' has %d)", device, h->prov.name, count);
    goto fail;
  }
  size_t free_bytes = 0, total = 0;
  st = h->prov.mem_info(h->prov.ctx, device, &free_bytes, &total);
  if (st != STASH_OK) {
    st = _stash_error(st, "provider '%s': cannot read device %d's memory: %s", h->prov.name,
                      device, _stash_provider_message());
    goto fail;
  }
  h->granularity = 2 * STASH_MiB;
  if (h->prov.granularity) {
    st = h->prov.granularity(h->prov.ctx, device, &h->granularity);
    if (st != STASH_OK) {
      st = _stash_error(st, "provider '%s': cannot read the page size: %s", h->prov.name,
                        _stash_provider_message());
      goto fail;
    }
  }
  if (c.policy == STASH_POLICY_STASH && !_stash_provider_has_vmm(&h->prov)) {
    st = _stash_error(STASH_ERR_UNSUPPORTED,
                      "policy:stash needs virtual memory functions, which provider '%s' lacks "
                      "(policy:pytorch works without them)", h->prov.name);
    goto fail;
  }
  if (c.expandable_segments) {
    if (!_stash_provider_has_vmm(&h->prov)) {
      st = _stash_error(STASH_ERR_UNSUPPORTED,
                        "expandable_segments:True needs virtual memory functions, which "
                        "provider '%s' lacks", h->prov.name);
      goto fail;
    }
    if (c.large_segment_size % h->granularity || (2 * STASH_MiB) % h->granularity) {
      st = _stash_error(STASH_ERR_CONF,
                        "expandable page sizes must be multiples of the device's page size "
                        "(%zu bytes)", h->granularity);
      goto fail;
    }
  }
  h->conf = c;
  h->device = device;
  h->device_total = total;
  if (c.per_process_memory_fraction < 1.0) {
    h->has_limit = true;
    h->allowed_max = (size_t)(c.per_process_memory_fraction * (double)total);
  }
  h->stats.size = sizeof h->stats;
  h->stats.version = STASH_STATS_VERSION;
  h->stats.max_split_size = (int64_t)c.max_split_size; /* SIZE_MAX reads as -1, as PyTorch */
  h->policy = policy_for(c.policy);
  st = h->policy->create(h);
  if (st != STASH_OK) goto fail;
  pthread_mutex_init(&h->lock, NULL);
  *out = h;
  return STASH_OK;
fail:
  free(h);
  return st;
}

stash_status_t stash_heap_destroy(stash_heap_t* h) {
  if (!h) return STASH_OK;
  stash_status_t st = h->policy->destroy(h);
  _stash_history_free(&h->history);
  if (atomic_load_explicit(&_stash_tracing, memory_order_relaxed)) _stash_trace_flush();
  pthread_mutex_destroy(&h->lock);
  free(h);
  return st;
}

stash_status_t stash_heap_alloc(stash_heap_t* h, size_t size, void* stream, void** out) {
  CHECK_HEAP(h, "stash_heap_alloc");
  if (!out) return _stash_error(STASH_ERR_INVALID, "stash_heap_alloc: out is NULL");
  *out = NULL;
  if (size == 0) return STASH_OK; /* PyTorch hands out no memory for 0 bytes */
  uint64_t ptr = 0;
  pthread_mutex_lock(&h->lock);
  stash_status_t st;
  if (size >= (size_t)1 << 60) { /* refused before any policy arithmetic can overflow */
    h->stats.num_ooms++;
    _stash_history_add(h, STASH_TRACE_OOM, 0, size, stream);
    char req[32];
    _stash_format_size(size, req, sizeof req);
    st = _stash_error(STASH_ERR_OOM, "out of memory: tried to allocate %s (%zu bytes), more "
                      "than 1 EiB", req, size);
  } else {
    st = h->policy->alloc(h, size, stream, &ptr);
  }
  pthread_mutex_unlock(&h->lock);
  if (st == STASH_OK) *out = (void*)(uintptr_t)ptr;
  return st;
}

stash_status_t stash_heap_free(stash_heap_t* h, void* ptr) {
  CHECK_HEAP(h, "stash_heap_free");
  if (!ptr) return STASH_OK;
  pthread_mutex_lock(&h->lock);
  stash_status_t st = h->policy->free(h, (uint64_t)(uintptr_t)ptr);
  pthread_mutex_unlock(&h->lock);
  return st;
}

stash_status_t stash_heap_record_stream(stash_heap_t* h, void* ptr, void* stream) {
  CHECK_HEAP(h, "stash_heap_record_stream");
  if (!ptr) return STASH_OK; /* as PyTorch: an empty tensor's null pointer is ignored */
  pthread_mutex_lock(&h->lock);
  stash_status_t st = h->policy->record_stream(h, (uint64_t)(uintptr_t)ptr, stream);
  pthread_mutex_unlock(&h->lock);
  return st;
}

stash_status_t stash_heap_capture_begin(stash_heap_t* h) {
  CHECK_HEAP(h, "stash_heap_capture_begin");
  pthread_mutex_lock(&h->lock);
  h->capturing++;
  pthread_mutex_unlock(&h->lock);
  return STASH_OK;
}

stash_status_t stash_heap_capture_end(stash_heap_t* h) {
  CHECK_HEAP(h, "stash_heap_capture_end");
  pthread_mutex_lock(&h->lock);
  stash_status_t st = STASH_OK;
  if (h->capturing > 0) h->capturing--;
  else st = _stash_error(STASH_ERR_INVALID, "stash_heap_capture_end: no capture underway");
  pthread_mutex_unlock(&h->lock);
  return st;
}

stash_status_t stash_heap_empty_cache(stash_heap_t* h) {
  CHECK_HEAP(h, "stash_heap_empty_cache");
  pthread_mutex_lock(&h->lock);
  stash_status_t st = h->policy->empty_cache(h);
  pthread_mutex_unlock(&h->lock);
  return st;
}

stash_status_t stash_heap_set_memory_fraction(stash_heap_t* h, double fraction) {
  CHECK_HEAP(h, "stash_heap_set_memory_fraction");
  if (!(fraction >= 0.0 && fraction <= 1.0))
    return _stash_error(STASH_ERR_INVALID, "invalid memory fraction %g: must be in [0, 1]",
                        fraction);
  pthread_mutex_lock(&h->lock);
  /* As PyTorch 2.11: 1.0 means no limit; the limit is a share of the device's total. */
  h->has_limit = fraction < 1.0;
  h->allowed_max = h->has_limit ? (size_t)(fraction * (double)h->device_total) : 0;
  pthread_mutex_unlock(&h->lock);
  return STASH_OK;
}

stash_status_t stash_heap_mem_get_info(stash_heap_t* h, size_t* free_bytes, size_t* total) {
  CHECK_HEAP(h, "stash_heap_mem_get_info");
  if (!free_bytes || !total)
    return _stash_error(STASH_ERR_INVALID, "stash_heap_mem_get_info: NULL output");
  _stash_provider_message_clear();
  stash_status_t st = h->prov.mem_info(h->prov.ctx, h->device, free_bytes, total);
  if (st != STASH_OK)
    return _stash_error(st, "provider '%s': mem_info failed: %s", h->prov.name,
                        _stash_provider_message());
  return STASH_OK;
}

int stash_heap_device(const stash_heap_t* h) { return h ? h->device : -1; }

void stash_heap_conf(const stash_heap_t* h, stash_conf_t* out) {
  if (h && out) *out = h->conf;
}

stash_status_t stash_heap_stats(stash_heap_t* h, stash_stats_t* out) {
  CHECK_HEAP(h, "stash_heap_stats");
  if (!out || out->size < offsetof(stash_stats_t, allocation))
    return _stash_error(STASH_ERR_INVALID, "stash_heap_stats: out is NULL or out->size unset");
  size_t n = out->size < sizeof *out ? out->size : sizeof *out;
  pthread_mutex_lock(&h->lock);
  stash_stats_t copy = h->stats;
  pthread_mutex_unlock(&h->lock);
  copy.size = (uint32_t)n;
  memcpy(out, &copy, n);
  return STASH_OK;
}

stash_status_t stash_heap_reset_peak_stats(stash_heap_t* h) {
  CHECK_HEAP(h, "stash_heap_reset_peak_stats");
  pthread_mutex_lock(&h->lock);
  _stash_stats_reset_peak(&h->stats);
  pthread_mutex_unlock(&h->lock);
  return STASH_OK;
}

stash_status_t stash_heap_reset_accumulated_stats(stash_heap_t* h) {
  CHECK_HEAP(h, "stash_heap_reset_accumulated_stats");
  pthread_mutex_lock(&h->lock);
  _stash_stats_reset_accumulated(&h->stats);
  pthread_mutex_unlock(&h->lock);
  return STASH_OK;
}

stash_status_t stash_heap_visit(stash_heap_t* h, stash_visit_fn fn, void* arg) {
  CHECK_HEAP(h, "stash_heap_visit");
  if (!fn) return _stash_error(STASH_ERR_INVALID, "stash_heap_visit: fn is NULL");
  pthread_mutex_lock(&h->lock);
  stash_status_t st = h->policy->visit(h, fn, arg);
  pthread_mutex_unlock(&h->lock);
  return st;
}

stash_status_t stash_heap_check(stash_heap_t* h) {
  CHECK_HEAP(h, "stash_heap_check");
  pthread_mutex_lock(&h->lock);
  stash_status_t st = h->policy->check(h);
  pthread_mutex_unlock(&h->lock);
  return st;
}

/* The heap's statistics into s; false (and buf emptied) if there are none to give. */
static bool stats_for_text(stash_heap_t* h, stash_stats_t* s, char* buf, size_t n) {
  memset(s, 0, sizeof *s);
  s->size = sizeof *s;
  if (h && stash_heap_stats(h, s) == STASH_OK) return true;
  if (n) buf[0] = '\0';
  return false;
}

size_t stash_heap_stats_json(stash_heap_t* h, char* buf, size_t n) {
  stash_stats_t s;
  return stats_for_text(h, &s, buf, n) ? stash_stats_json(&s, buf, n) : 0;
}

size_t stash_heap_summary(stash_heap_t* h, bool abbreviated, char* buf, size_t n) {
  stash_stats_t s;
  return stats_for_text(h, &s, buf, n) ? stash_stats_summary(&s, h->device, abbreviated, buf, n) : 0;
}

size_t stash_heap_reserved_bytes(stash_heap_t* h) {
  if (!h) return 0;
  pthread_mutex_lock(&h->lock);
  size_t r = h->total_reserved;
  pthread_mutex_unlock(&h->lock);
  return r;
}
