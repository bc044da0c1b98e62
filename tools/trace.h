/* trace.h: allocation traces - reading RMM's CSV log into a list of events. */
#ifndef STASH_TRACE_H
#define STASH_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum trace_op_e { TRACE_ALLOC = 0, TRACE_FREE = 1 } trace_op_t;

typedef struct trace_event_s {
  uint32_t op;     /* trace_op_t */
  uint32_t stream; /* index into trace_t.streams */
  uint64_t id;     /* allocation number: the n-th allocate of the trace */
  uint64_t size;   /* requested bytes (allocs; for frees, the allocation's size) */
  uint64_t line;   /* line in the file */
  uint64_t ptr;    /* the address the traced program got (or freed) */
} trace_event_t;

typedef struct trace_s {
  char* path;
  const char* name;     /* file name without directories */
  trace_event_t* events;
  size_t nevents;
  uint64_t nallocs;     /* allocation ids are 0..nallocs-1 */
  uint64_t* streams;    /* the trace's stream handles, in order of appearance */
  size_t nstreams;
  uint64_t peak_live;   /* largest sum of requested sizes live at once (saturating) */
  size_t skipped_frees; /* frees of pointers not live in the trace (reported, skipped) */
  size_t skipped_failures; /* "allocate failure" rows */
  size_t implicit_frees;   /* allocations of a still-live address: a free was assumed */
} trace_t;

/* Read an RMM CSV log or a PyTorch memory snapshot (torch.cuda.memory._snapshot() pickled,
 * with record_memory_history on: its first device with a trace, "alloc" and
 * "free_completed" entries), plain or gzip. On failure returns false with a message naming
 * the file and the line (CSV) or event (snapshot) in err. Warnings (skipped rows) go to
 * `warn` if it is not NULL. trace_event_t.line is the event's position for snapshots. */
bool trace_read(const char* path, trace_t* out, char* err, size_t errlen,
                void (*warn)(const char* msg, void* arg), void* warn_arg);
/* The same from an open file descriptor (taken over and closed), named `name` in messages. */
bool trace_read_fd(int fd, const char* name, trace_t* out, char* err, size_t errlen,
                   void (*warn)(const char* msg, void* arg), void* warn_arg);
void trace_free(trace_t* t);

/* Parse a size with an optional K/M/G/T suffix (binary; "iB" or "B" accepted). */
bool trace_parse_size(const char* s, uint64_t* out);

#endif
