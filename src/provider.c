/* provider.c: provider tables - validation on registration, call names. */
#include <stddef.h>
#include <string.h>

#include "internal.h"

const char* stash_provider_call_name(stash_provider_call_t call) {
  switch (call) {
#define STASH_X_(name, doc) \
  case STASH_CALL_##name:   \
    return #name;
    STASH_PROVIDER_CALLS(STASH_X_)
#undef STASH_X_
    case STASH_CALL_ANY:
      return "any";
  }
  return "?";
}

stash_status_t _stash_provider_copy(stash_provider_t* dst, const stash_provider_t* src) {
  if (!src) return _stash_error(STASH_ERR_INVALID, "provider is NULL");
  /* The size each version's table has: a version adds fields at the end. */
  static const size_t sizes[] = {0, offsetof(stash_provider_t, stream_wait),
                                 sizeof(stash_provider_t)};
  if (src->version < 1 || src->version > STASH_PROVIDER_VERSION ||
      src->size != sizes[src->version])
    return _stash_error(STASH_ERR_INVALID,
                        "provider '%s' has table version %u (size %u); this stash reads "
                        "versions 1 (size %zu) to %u (size %zu)",
                        src->name ? src->name : "?", src->version, src->size, sizes[1],
                        STASH_PROVIDER_VERSION, sizeof(stash_provider_t));
  const char* missing = NULL;
  if (!src->device_count) missing = "device_count";
  else if (!src->mem_info) missing = "mem_info";
  else if (!src->mem_alloc) missing = "mem_alloc";
  else if (!src->mem_free) missing = "mem_free";
  else if (!src->event_create) missing = "event_create";
  else if (!src->event_record) missing = "event_record";
  else if (!src->event_query) missing = "event_query";
  else if (!src->event_synchronize) missing = "event_synchronize";
  else if (!src->event_destroy) missing = "event_destroy";
  else if (!src->stream_synchronize) missing = "stream_synchronize";
  if (missing)
    return _stash_error(STASH_ERR_INVALID, "provider '%s' lacks the required function %s",
                        src->name ? src->name : "?", missing);
  memset(dst, 0, sizeof *dst); /* what an older version lacks is NULL: not provided */
  memcpy(dst, src, src->size);
  dst->version = STASH_PROVIDER_VERSION;
  dst->size = sizeof *dst;
  return STASH_OK;
}

bool _stash_provider_has_vmm(const stash_provider_t* p) {
  return p->granularity && p->va_reserve && p->va_free && p->phys_create &&
         p->phys_release && p->map && p->unmap && p->set_access;
}

stash_status_t _stash_prov_fail(stash_heap_t* h, stash_status_t st, const char* what) {
  return _stash_error(st, "provider '%s' failed to %s: %s", h->prov.name, what,
                      _stash_provider_message());
}
