/* history.c: the events a heap records when asked to (stash_heap_record_history): a ring
 * buffer of the newest max_entries allocations, frees and segment changes, with their
 * times, in the terms of PyTorch's memory history (torch.cuda.memory._record_memory_history)
 * so that a snapshot made from them opens in PyTorch's memory visualizer. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* ---- STASH_TRACE: every heap's calls logged in RMM's CSV format ---------------------------- */

#define MAX_TRACE_FILES 64

static pthread_once_t g_trace_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_trace_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_trace_path[4096];
static bool g_trace_per_device; /* the path holds "%d": one file per device */
static FILE* g_trace_files[MAX_TRACE_FILES];
static _Thread_local unsigned tls_thread;
static unsigned g_threads;
_Atomic bool _stash_tracing;

static void trace_flush_all(void) {
  pthread_mutex_lock(&g_trace_lock);
  for (int i = 0; i < MAX_TRACE_FILES; i++)
    if (g_trace_files[i]) fflush(g_trace_files[i]);
  pthread_mutex_unlock(&g_trace_lock);
}

static void trace_init(void) {
  const char* p = getenv("STASH_TRACE");
  if (!p || !*p || strlen(p) >= sizeof g_trace_path) return;
  strcpy(g_trace_path, p);
  const char* pct = strstr(p, "%d");
  g_trace_per_device = pct && !strchr(pct + 2, '%') && !memchr(p, '%', (size_t)(pct - p));
  _stash_tracing = true;
  atexit(trace_flush_all);
}

void _stash_trace_start(void) { pthread_once(&g_trace_once, trace_init); }

/* The device's log (opened, with its header, on first use); NULL if it cannot be opened
 * (said once on stderr). Trace lock held. */
static FILE* trace_file(int device) {
  int k = g_trace_per_device ? device : 0;
  if (k < 0 || k >= MAX_TRACE_FILES) return NULL;
  if (g_trace_files[k]) return g_trace_files[k];
  char path[4200];
  if (g_trace_per_device) snprintf(path, sizeof path, g_trace_path, device);
  else snprintf(path, sizeof path, "%s", g_trace_path);
  FILE* f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "stash: STASH_TRACE: cannot write '%s'; not tracing\n", path);
    _stash_tracing = false;
    return NULL;
  }
  fputs("Thread,Time,Action,Pointer,Size,Stream\n", f);
  g_trace_files[k] = f;
  return f;
}

static void trace_row(stash_heap_t* h, stash_trace_action_t action, uint64_t address,
                      size_t size, void* stream, const struct timespec* ts) {
  const char* what = action == STASH_TRACE_ALLOC             ? "allocate"
                     : action == STASH_TRACE_FREE_COMPLETED ? "free"
                     : action == STASH_TRACE_OOM            ? "allocate failure"
                                                            : NULL;
  if (!what) return;
  if (action == STASH_TRACE_OOM) address = 0; /* the history's OOM address is the free memory */
  struct tm tm;
  time_t secs = ts->tv_sec;
  localtime_r(&secs, &tm);
  pthread_mutex_lock(&g_trace_lock);
  if (!tls_thread) tls_thread = ++g_threads;
  FILE* f = trace_file(h->device);
  if (f)
    fprintf(f, "%u,%02d:%02d:%02d.%06ld,%s,0x%llx,%zu,0x%llx\n", tls_thread - 1, tm.tm_hour,
            tm.tm_min, tm.tm_sec, ts->tv_nsec / 1000, what, (unsigned long long)address, size,
            (unsigned long long)(uintptr_t)stream);
  pthread_mutex_unlock(&g_trace_lock);
}

void _stash_trace_flush(void) { trace_flush_all(); }

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
  if (atomic_load_explicit(&_stash_tracing, memory_order_relaxed))
    trace_row(h, action, address, size, stream, &ts);
  if (!t->cap) return;
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
