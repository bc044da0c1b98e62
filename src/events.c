/* events.c: cross-stream frees - events recorded on the streams a block was used on, kept in
 * one FIFO per stream and completed in order, and a pool of events reused so that the
 * driver creates each event once.
 *
 * Used by the policies under the heap's lock. Every container is grown before the first
 * provider call, so that recording is all or nothing: on failure no event is queued and the
 * events already taken go back to the pool.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static stash_ev_queue_t* queue_for(stash_events_t* e, void* stream) {
  for (size_t i = 0; i < e->nqueues; i++) {
    if (e->queues[i].stream == stream) return &e->queues[i];
  }
  return NULL;
}

static bool queue_reserve(stash_ev_queue_t* q, size_t extra) {
  if (q->n + extra <= q->cap) return true;
  size_t cap = q->cap ? q->cap : 8;
  while (cap < q->n + extra) cap *= 2;
  stash_ev_entry_t* v = malloc(cap * sizeof *v);
  if (!v) return false;
  for (size_t i = 0; i < q->n; i++) v[i] = q->v[(q->head + i) % q->cap];
  free(q->v);
  q->v = v;
  q->head = 0;
  q->cap = cap;
  return true;
}

/* Drop empty queues (as PyTorch erases a stream's deque once it is empty). */
static void compact(stash_events_t* e) {
  size_t k = 0;
  for (size_t i = 0; i < e->nqueues; i++) {
    if (e->queues[i].n) e->queues[k++] = e->queues[i];
    else free(e->queues[i].v);
  }
  e->nqueues = k;
}

static stash_status_t host_oom(stash_events_t* e) {
  compact(e);
  return _stash_error(STASH_ERR_HOST_OOM, "free: out of host memory");
}

stash_status_t _stash_uses_add(void*** uses, uint32_t* n, uint32_t* cap, void* stream) {
  for (uint32_t i = 0; i < *n; i++) {
    if ((*uses)[i] == stream) return STASH_OK;
  }
  if (*n == *cap) {
    uint32_t c = *cap ? *cap * 2 : 2;
    void** v = realloc(*uses, c * sizeof *v);
    if (!v) return _stash_error(STASH_ERR_HOST_OOM, "record_stream: out of host memory");
    *uses = v;
    *cap = c;
  }
  (*uses)[(*n)++] = stream;
  return STASH_OK;
}

/* An event - from the pool, or created - recorded on `stream`. On failure none is taken (a
 * created one goes to the pool, which has room for every event the heap owns). */
static stash_status_t record_one(stash_heap_t* h, stash_events_t* e, void* stream,
                                 uint64_t* out) {
  uint64_t ev = 0;
  if (e->npool) {
    ev = e->pool[--e->npool];
  } else {
    stash_status_t st = _STASH_PCALL(h, event_create, h->device, &ev);
    if (st != STASH_OK) return _stash_prov_fail(h, st, "create an event");
    e->nevents++;
  }
  stash_status_t st = _STASH_PCALL(h, event_record, h->device, ev, stream);
  if (st != STASH_OK) {
    e->pool[e->npool++] = ev;
    return _stash_prov_fail(h, st, "record an event");
  }
  *out = ev;
  return STASH_OK;
}

stash_status_t _stash_events_record(stash_heap_t* h, stash_events_t* e, void* const* streams,
                                    size_t n, void* item) {
  stash_ev_queue_t* queues =
      _stash_array_grow(e->queues, &e->cap_queues, e->nqueues + n, sizeof *queues, 4);
  if (!queues) return host_oom(e);
  e->queues = queues;
  for (size_t i = 0; i < n; i++) {
    stash_ev_queue_t* q = queue_for(e, streams[i]);
    if (!q) {
      q = &e->queues[e->nqueues++];
      memset(q, 0, sizeof *q);
      q->stream = streams[i];
    }
    if (!queue_reserve(q, 1)) return host_oom(e);
  }
  /* Room for every event the heap may ever own, so that recycling cannot fail (a deferred
   * entry's event counted already: it is made when recorded). */
  uint64_t* pool = _stash_array_grow(e->pool, &e->cap_pool, e->nevents + e->ndeferred + n,
                                     sizeof *pool, 16);
  if (!pool) return host_oom(e);
  e->pool = pool;
  if (h->capturing) { /* queued now, recorded once no capture is underway */
    for (size_t i = 0; i < n; i++) {
      stash_ev_queue_t* q = queue_for(e, streams[i]);
      q->v[(q->head + q->n++) % q->cap] = (stash_ev_entry_t){0, item, true};
    }
    e->ndeferred += n;
    return STASH_OK;
  }
  uint64_t local[64];
  uint64_t* ev = n <= 64 ? local : malloc(n * sizeof *ev);
  if (!ev) return host_oom(e);
  stash_status_t st = STASH_OK;
  size_t made = 0; /* events recorded */
  while (made < n && (st = record_one(h, e, streams[made], &ev[made])) == STASH_OK) made++;
  if (st == STASH_OK) {
    for (size_t i = 0; i < n; i++) {
      stash_ev_queue_t* q = queue_for(e, streams[i]);
      q->v[(q->head + q->n++) % q->cap] = (stash_ev_entry_t){ev[i], item, false};
    }
  } else {
    for (size_t i = 0; i < made; i++) e->pool[e->npool++] = ev[i];
    compact(e);
  }
  if (ev != local) free(ev);
  return st;
}

/* Record the events of the entries queued during captures, now that none is underway. */
static stash_status_t record_deferred(stash_heap_t* h, stash_events_t* e) {
  for (size_t i = 0; i < e->nqueues && e->ndeferred; i++) {
    stash_ev_queue_t* q = &e->queues[i];
    for (size_t k = 0; k < q->n; k++) {
      stash_ev_entry_t* x = &q->v[(q->head + k) % q->cap];
      if (!x->deferred) continue;
      stash_status_t st = record_one(h, e, q->stream, &x->event);
      if (st != STASH_OK) return st;
      x->deferred = false;
      e->ndeferred--;
    }
  }
  return STASH_OK;
}

stash_status_t _stash_events_poll_queues(stash_heap_t* h, stash_events_t* e, bool wait,
                                         stash_ev_done_fn done, const stash_ev_poll_t* how) {
  if (h->capturing) return STASH_OK;
  stash_status_t st = e->ndeferred ? record_deferred(h, e) : STASH_OK;
  for (size_t i = 0; i < e->nqueues && st == STASH_OK; i++) {
    stash_ev_queue_t* q = &e->queues[i];
    if (how && how->has_skip && q->stream == how->skip && q->n < how->skip_below) continue;
    size_t known_done = 0; /* entries from the head known to have completed */
    bool ask_last = how != NULL; /* the last entry not yet found incomplete in this poll */
    while (q->n) {
      stash_ev_entry_t* x = &q->v[q->head];
      if (!known_done) {
        stash_status_t r = wait ? _STASH_PCALL(h, event_synchronize, x->event)
                                : _STASH_PCALL(h, event_query, x->event);
        if (r == STASH_ERR_NOT_READY && !wait) break;
        if (r != STASH_OK) {
          st = _stash_prov_fail(h, r, wait ? "wait for an event" : "query an event");
          break;
        }
        known_done = 1;
        if (ask_last && q->n > 1) { /* the first has completed: has the last? */
          r = _STASH_PCALL(h, event_query, q->v[(q->head + q->n - 1) % q->cap].event);
          if (r == STASH_OK) known_done = q->n;
          else if (r == STASH_ERR_NOT_READY) ask_last = false; /* entry by entry from here */
          else {
            st = _stash_prov_fail(h, r, "query an event");
            break;
          }
        }
      }
      void* item = x->item;
      e->pool[e->npool++] = x->event;
      q->head = (q->head + 1) % q->cap;
      q->n--;
      known_done--;
      done(h, item);
    }
  }
  compact(e);
  return st;
}

bool _stash_events_last(const stash_events_t* e, void* stream, uint64_t* event) {
  const stash_ev_queue_t* q = queue_for((stash_events_t*)e, stream);
  if (!q || !q->n) return false;
  const stash_ev_entry_t* x = &q->v[(q->head + q->n - 1) % q->cap];
  if (x->deferred) return false;
  *event = x->event;
  return true;
}

size_t _stash_events_queued(const stash_events_t* e, void* stream) {
  const stash_ev_queue_t* q = queue_for((stash_events_t*)e, stream);
  return q ? q->n : 0;
}

void _stash_events_foreach(const stash_events_t* e, void (*fn)(void* item, void* arg),
                           void* arg) {
  for (size_t i = 0; i < e->nqueues; i++) {
    const stash_ev_queue_t* q = &e->queues[i];
    for (size_t k = 0; k < q->n; k++) fn(q->v[(q->head + k) % q->cap].item, arg);
  }
}

stash_status_t _stash_events_destroy(stash_heap_t* h, stash_events_t* e) {
  stash_status_t first = STASH_OK;
  for (size_t i = 0; i < e->nqueues; i++) {
    stash_ev_queue_t* q = &e->queues[i];
    for (; q->n; q->n--, q->head = (q->head + 1) % q->cap) {
      if (q->v[q->head].deferred) continue; /* never recorded: no event */
      stash_status_t r = _STASH_PCALL(h, event_destroy, q->v[q->head].event);
      if (r != STASH_OK && first == STASH_OK) first = r;
    }
    free(q->v);
  }
  for (size_t i = 0; i < e->npool; i++) {
    stash_status_t r = _STASH_PCALL(h, event_destroy, e->pool[i]);
    if (r != STASH_OK && first == STASH_OK) first = r;
  }
  free(e->queues);
  free(e->pool);
  memset(e, 0, sizeof *e);
  return first;
}
