/* oom.c: the out-of-memory report, shared by the policies: what was asked, what the device
 * has free, what the heap holds and could not use. Lock held. */
#include <stdio.h>

#include "internal.h"

stash_status_t _stash_report_oom(stash_heap_t* h, size_t orig, void* stream, const char* needed,
                                 size_t largest_free, const char* advice) {
  h->stats.num_ooms++;
  size_t dev_free = 0, dev_total = 0;
  bool info = _STASH_PCALL(h, mem_info, h->device, &dev_free, &dev_total) == STASH_OK;
  _stash_history_add(h, STASH_TRACE_OOM, dev_free, orig, stream); /* PyTorch: device_free */
  char req[32], tot[32], fre[32], al[32], cached[32], largest[32], allowed[96] = "";
  _stash_format_size(orig, req, sizeof req);
  _stash_format_size(dev_total, tot, sizeof tot);
  _stash_format_size(dev_free, fre, sizeof fre);
  int64_t a = h->stats.allocated_bytes[STASH_STAT_ALL].current;
  int64_t r = h->stats.reserved_bytes[STASH_STAT_ALL].current;
  _stash_format_size((size_t)a, al, sizeof al);
  _stash_format_size(r > a ? (size_t)(r - a) : 0, cached, sizeof cached);
  _stash_format_size(largest_free, largest, sizeof largest);
  if (h->has_limit) {
    char lim[32];
    _stash_format_size(h->allowed_max, lim, sizeof lim);
    snprintf(allowed, sizeof allowed, " The memory fraction allows this heap %s.", lim);
  }
  char dev[128];
  if (info)
    snprintf(dev, sizeof dev, "Device %d has a total capacity of %s of which %s is free.",
             h->device, tot, fre);
  else
    snprintf(dev, sizeof dev, "Device %d's free memory is unknown (mem_info failed).", h->device);
  return _stash_error(STASH_ERR_OOM,
                      "out of memory: tried to allocate %s (%zu bytes requested%s%s%s). %s%s Of "
                      "its memory, this heap has %s allocated and %s reserved but unallocated; "
                      "its largest free block is %s.%s%s",
                      req, orig, needed ? "; " : "", needed ? needed : "", needed ? " needed" : "",
                      dev, allowed, al, cached, largest, advice ? " " : "", advice ? advice : "");
}
