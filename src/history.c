/* history.c: the events a heap records when asked to (stash_heap_record_history): a ring
 * buffer of the newest max_entries allocations, frees and segment changes, with their
 * times, in the terms of PyTorch's memory history (torch.cuda.memory._record_memory_history)
 * so that a snapshot made from them opens in PyTorch's memory visualizer. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static const char* const k_names[_STASH_TRACE_LAST] = {
    "alloc", "free_requested", "free_completed", "segment_alloc",
    "segment_free", "segment_map", "segment_unmap", "oom"};

const char* stash_trace_action_name(stash_trace_action_t action) {
  return (int)action >= 0 && action < _STASH_TRACE_LAST ? k_names[action] : "?";
}

void _stash_history_add_(stash_heap_t* h, stash_trace_action_t action, uint64_t address,
                         size_t size, void* stream) {
  stash_history_t* t = &h->history;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  t->v[t->next] = (stash_trace_entry_t){action, (uintptr_t)address, size, stream,
                                        (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000};
  t->next = (t->next + 1) % t->cap;
  if (t->count < t->cap) t->count++;
}

void _stash_history_free(stash_history_t* t) {
  free(t->v);
  memset(t, 0, sizeof *t);
}

/* Copy up to n of the newest entries, oldest first. Lock held. */
static size_t copy_out(const stash_history_t* t, stash_trace_entry_t* out, size_t n) {
  size_t k = n < t->count ? n : t->count;
  size_t start = (t->next + t->cap - t->count) % (t->cap ? t->cap : 1);
  size_t skip = t->count - k; /* keep the newest k */
  for (size_t i = 0; i < k; i++) out[i] = t->v[(start + skip + i) % t->cap];
  return k;
}

stash_status_t stash_heap_record_history(stash_heap_t* h, size_t max_entries) {
  if (!h) return _stash_error(STASH_ERR_INVALID, "stash_heap_record_history: heap is NULL");
  if (max_entries > ((size_t)1 << 40) / sizeof(stash_trace_entry_t))
    return _stash_error(STASH_ERR_INVALID, "stash_heap_record_history: %zu entries is too many",
                        max_entries);
  stash_trace_entry_t* v = NULL;
  if (max_entries) {
    v = malloc(max_entries * sizeof *v);
    if (!v) return _stash_error(STASH_ERR_HOST_OOM, "stash_heap_record_history: out of host memory");
  }
  pthread_mutex_lock(&h->lock);
  stash_history_t t = {v, max_entries, 0, 0};
  if (v && h->history.count) {
    t.count = copy_out(&h->history, v, max_entries);
    t.next = t.count % max_entries;
  }
  _stash_history_free(&h->history);
  h->history = t;
  pthread_mutex_unlock(&h->lock);
  return STASH_OK;
}

size_t stash_heap_history(stash_heap_t* h, stash_trace_entry_t* out, size_t n) {
  if (!h) return 0;
  pthread_mutex_lock(&h->lock);
  size_t count = h->history.count;
  if (out && n) copy_out(&h->history, out, n < count ? n : count);
  pthread_mutex_unlock(&h->lock);
  return count;
}
