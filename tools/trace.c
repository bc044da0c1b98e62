/* trace.c: reading allocation traces: RMM's CSV log, or a PyTorch memory snapshot
 * (snapshot.c), into one list of events.
 *
 * The format is that of RMM's logging_resource_adaptor:
 *   Thread,Time,Action,Pointer,Size,Stream
 *   0,03:17:27.391041,allocate,0x7f19b4000000,154389504,0x0
 * Columns are found by name in the header. Actions: "allocate", "free", and "allocate
 * failure" (skipped). A free refers to the live allocation at its pointer. zlib reads
 * plain and gzip-compressed files alike.
 */
#include "trace.h"

#include "snapshot.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define LINE_MAX_BYTES 4096

/* A small open-addressing map: trace pointer -> (allocation id, size). */
typedef struct live_s {
  uint64_t* keys;
  uint64_t* ids;
  uint64_t* sizes;
  size_t cap, count;
  bool max_live; /* pointer UINT64_MAX, whose key (ptr + 1) would be the empty key 0 */
  uint64_t max_id, max_size;
} live_t;

static size_t live_slot(uint64_t key, size_t cap) {
  return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
}

static bool live_grow(live_t* m) {
  size_t cap = m->cap ? m->cap * 2 : 1024;
  live_t n = {calloc(cap, 8), calloc(cap, 8), calloc(cap, 8), cap, 0,
              m->max_live, m->max_id, m->max_size};
  if (!n.keys || !n.ids || !n.sizes) {
    free(n.keys);
    free(n.ids);
    free(n.sizes);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = live_slot(m->keys[i], cap);
    while (n.keys[j]) j = (j + 1) & (cap - 1);
    n.keys[j] = m->keys[i];
    n.ids[j] = m->ids[i];
    n.sizes[j] = m->sizes[i];
    n.count++;
  }
  free(m->keys);
  free(m->ids);
  free(m->sizes);
  *m = n;
  return true;
}

/* Keys are stored +1 so that pointer 0 is representable. */
static bool live_put(live_t* m, uint64_t ptr, uint64_t id, uint64_t size) {
  if (ptr == UINT64_MAX) {
    m->max_live = true;
    m->max_id = id;
    m->max_size = size;
    return true;
  }
  if ((m->count + 1) * 2 > m->cap && !live_grow(m)) return false;
  uint64_t key = ptr + 1;
  size_t i = live_slot(key, m->cap);
  while (m->keys[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
  if (!m->keys[i]) m->count++;
  m->keys[i] = key;
  m->ids[i] = id;
  m->sizes[i] = size;
  return true;
}

static bool live_take(live_t* m, uint64_t ptr, uint64_t* id, uint64_t* size) {
  if (ptr == UINT64_MAX) {
    if (!m->max_live) return false;
    *id = m->max_id;
    *size = m->max_size;
    m->max_live = false;
    return true;
  }
  if (!m->cap) return false;
  uint64_t key = ptr + 1;
  size_t mask = m->cap - 1, i = live_slot(key, m->cap);
  while (m->keys[i] != key) {
    if (!m->keys[i]) return false;
    i = (i + 1) & mask;
  }
  *id = m->ids[i];
  *size = m->sizes[i];
  size_t hole = i, j = (i + 1) & mask;
  while (m->keys[j]) {
    size_t home = live_slot(m->keys[j], m->cap);
    bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!in_range) {
      m->keys[hole] = m->keys[j];
      m->ids[hole] = m->ids[j];
      m->sizes[hole] = m->sizes[j];
      hole = j;
    }
    j = (j + 1) & mask;
  }
  m->keys[hole] = 0;
  m->count--;
  return true;
}

static void live_free(live_t* m) {
  free(m->keys);
  free(m->ids);
  free(m->sizes);
}

static bool parse_u64(const char* s, int base, uint64_t* out) {
  while (*s == ' ') s++;
  if (!*s || *s == '-' || *s == '+') return false;
  errno = 0;
  char* end;
  unsigned long long v = strtoull(s, &end, base);
  while (*end == ' ') end++;
  if (errno || end == s || *end) return false;
  *out = v;
  return true;
}

bool trace_parse_size(const char* s, uint64_t* out) {
  char* end;
  if (!s || !isdigit((unsigned char)*s)) return false;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return false;
  unsigned shift = 0;
  switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: break;
  }
  if (shift && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'B' || end[1] == 'b')) end += 2;
  else if (end[0] == 'B' || end[0] == 'b') end += 1;
  if (*end) return false;
  if (shift && v > (UINT64_MAX >> shift)) return false;
  *out = (uint64_t)v << shift;
  return true;
}

static void fail(char* err, size_t n, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
}

static bool push_event(trace_t* t, size_t* cap, trace_event_t e) {
  if (t->nevents == *cap) {
    size_t c = *cap ? *cap * 2 : 4096;
    trace_event_t* v = realloc(t->events, c * sizeof *v);
    if (!v) return false;
    t->events = v;
    *cap = c;
  }
  t->events[t->nevents++] = e;
  return true;
}

static int stream_index(trace_t* t, uint64_t stream) {
  for (size_t i = 0; i < t->nstreams; i++) {
    if (t->streams[i] == stream) return (int)i;
  }
  uint64_t* v = realloc(t->streams, (t->nstreams + 1) * sizeof *v);
  if (!v) return -1;
  t->streams = v;
  t->streams[t->nstreams] = stream;
  return (int)t->nstreams++;
}

enum { COL_ACTION, COL_POINTER, COL_SIZE, COL_STREAM, NCOLS };
static const char* const k_colnames[NCOLS] = {"Action", "Pointer", "Size", "Stream"};

/* Split line in place at commas; returns the field count. */
static int split(char* line, char** fields, int max) {
  int n = 0;
  char* p = line;
  for (;;) {
    if (n == max) return max + 1;
    fields[n++] = p;
    char* c = strchr(p, ',');
    if (!c) break;
    *c = '\0';
    p = c + 1;
  }
  return n;
}

/* On a truncated or corrupt gzip stream gzgets returns the partial line before the error
 * and reports the error only on the next call: a line that does not end in '\n' is
 * checked for a read error before it is parsed. */
static bool read_error(gzFile f, const char* line) {
  size_t n = strlen(line);
  if (n && line[n - 1] == '\n') return false;
  int e;
  gzerror(f, &e);
  return e != Z_OK && e != Z_STREAM_END;
}

static void chomp(char* s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = '\0';
}

/* ---- Building the event list (both formats) ------------------------------------------- */

typedef struct build_s {
  trace_t* t;
  live_t live;
  size_t cap;
  uint64_t cur_live, cur_wraps; /* live sum: cur_wraps * 2^64 + cur_live */
  const char* path;
  bool by_event; /* positions are snapshot events, not lines */
  void (*warn)(const char* msg, void* arg);
  void* warn_arg;
  char* err;
  size_t errlen;
} build_t;

static void where(const build_t* b, uint64_t pos, char* out, size_t n) {
  if (b->by_event) snprintf(out, n, "%s: event %llu", b->path, (unsigned long long)pos);
  else snprintf(out, n, "%s:%llu", b->path, (unsigned long long)pos);
}

static void warn_at(build_t* b, uint64_t pos, const char* fmt, uint64_t ptr) {
  if (!b->warn) return;
  char at[300], msg[512];
  where(b, pos, at, sizeof at);
  snprintf(msg, sizeof msg, "%s: ", at);
  size_t k = strlen(msg);
  snprintf(msg + k, sizeof msg - k, fmt, (unsigned long long)ptr);
  b->warn(msg, b->warn_arg);
}

static bool oom(build_t* b) {
  fail(b->err, b->errlen, "%s: out of memory", b->path);
  return false;
}

static bool build_alloc(build_t* b, uint64_t ptr, uint64_t size, uint64_t stream, uint64_t pos) {
  trace_t* t = b->t;
  int si = stream_index(t, stream);
  if (si < 0) return oom(b);
  trace_event_t e = {.stream = (uint32_t)si, .line = pos, .ptr = ptr};
  trace_event_t old = e;
  if (live_take(&b->live, ptr, &old.id, &old.size)) {
    /* The address is still live: its free is missing. Free it here. */
    warn_at(b, pos, "allocate of 0x%llx, which is still live; its free is missing and is "
            "assumed here", ptr);
    old.op = TRACE_FREE;
    if (b->cur_live < old.size) b->cur_wraps--;
    b->cur_live -= old.size;
    t->implicit_frees++;
    if (!push_event(t, &b->cap, old)) return oom(b);
  }
  e.op = TRACE_ALLOC;
  e.id = t->nallocs++;
  e.size = size;
  if (!live_put(&b->live, ptr, e.id, size)) return oom(b);
  b->cur_live += size;
  if (b->cur_live < size) b->cur_wraps++; /* past 2^64: peak_live saturates */
  uint64_t now = b->cur_wraps ? UINT64_MAX : b->cur_live;
  if (now > t->peak_live) t->peak_live = now;
  return push_event(t, &b->cap, e) || oom(b);
}

static bool build_free(build_t* b, uint64_t ptr, uint64_t stream, uint64_t pos) {
  trace_t* t = b->t;
  int si = stream_index(t, stream);
  if (si < 0) return oom(b);
  trace_event_t e = {.op = TRACE_FREE, .stream = (uint32_t)si, .line = pos, .ptr = ptr};
  if (!live_take(&b->live, ptr, &e.id, &e.size)) {
    t->skipped_frees++;
    warn_at(b, pos, "free of 0x%llx, which is not live in the trace; skipped", ptr);
    return true;
  }
  if (b->cur_live < e.size) b->cur_wraps--;
  b->cur_live -= e.size;
  return push_event(t, &b->cap, e) || oom(b);
}

/* ---- RMM's CSV log ----------------------------------------------------------------------- */

static bool read_csv(build_t* b, gzFile f, char* line, size_t linecap) {
  const char* path = b->path;
  char* err = b->err;
  size_t errlen = b->errlen;
  uint64_t lineno = 1;
  int col[NCOLS];
  char* fields[32];
  if (read_error(f, line)) {
    int e;
    fail(err, errlen, "%s:1: read error: %s (truncated or corrupt gzip?)", path, gzerror(f, &e));
    return false;
  }
  chomp(line);
  int ncols = split(line, fields, 32);
  for (int c = 0; c < NCOLS; c++) {
    col[c] = -1;
    for (int i = 0; i < ncols && i < 32; i++) {
      char* fld = fields[i];
      while (*fld == ' ') fld++;
      if (strcmp(fld, k_colnames[c]) == 0) col[c] = i;
    }
    if (col[c] < 0) {
      fail(err, errlen, "%s:1: not an RMM log: the header has no '%s' column (expected "
           "'Thread,Time,Action,Pointer,Size,Stream', or a PyTorch memory snapshot)", path,
           k_colnames[c]);
      return false;
    }
  }
  for (;;) {
    if (!gzgets(f, line, (int)linecap)) break;
    lineno++;
    if (read_error(f, line)) break; /* reported below */
    size_t len = strlen(line);
    if (len == linecap - 1 && line[len - 1] != '\n') {
      fail(err, errlen, "%s:%llu: line longer than %d bytes", path, (unsigned long long)lineno,
           LINE_MAX_BYTES - 2);
      return false;
    }
    chomp(line);
    if (line[0] == '\0') continue;
    int n = split(line, fields, 32);
    if (n != ncols) {
      fail(err, errlen, "%s:%llu: %d fields, the header has %d", path,
           (unsigned long long)lineno, n > 32 ? 32 : n, ncols);
      return false;
    }
    const char* action = fields[col[COL_ACTION]];
    uint64_t ptr, size, stream;
    if (!parse_u64(fields[col[COL_POINTER]], 16, &ptr)) {
      fail(err, errlen, "%s:%llu: bad pointer '%s'", path, (unsigned long long)lineno,
           fields[col[COL_POINTER]]);
      return false;
    }
    if (!parse_u64(fields[col[COL_SIZE]], 10, &size)) {
      fail(err, errlen, "%s:%llu: bad size '%s'", path, (unsigned long long)lineno,
           fields[col[COL_SIZE]]);
      return false;
    }
    if (!parse_u64(fields[col[COL_STREAM]], 16, &stream)) {
      fail(err, errlen, "%s:%llu: bad stream '%s'", path, (unsigned long long)lineno,
           fields[col[COL_STREAM]]);
      return false;
    }
    bool ok;
    if (strcmp(action, "allocate") == 0) {
      ok = build_alloc(b, ptr, size, stream, lineno);
    } else if (strcmp(action, "free") == 0) {
      ok = build_free(b, ptr, stream, lineno);
    } else if (strcmp(action, "allocate failure") == 0) {
      b->t->skipped_failures++;
      ok = true;
    } else {
      fail(err, errlen, "%s:%llu: unknown action '%s' (allocate, free, allocate failure)", path,
           (unsigned long long)lineno, action);
      return false;
    }
    if (!ok) return false;
  }
  int e;
  const char* zmsg = gzerror(f, &e);
  if (e != Z_OK && e != Z_STREAM_END) {
    fail(err, errlen, "%s:%llu: read error: %s (truncated or corrupt gzip?)", path,
         (unsigned long long)lineno, zmsg);
    return false;
  }
  if (!gzeof(f)) {
    fail(err, errlen, "%s:%llu: read error", path, (unsigned long long)lineno);
    return false;
  }
  return true;
}

/* ---- PyTorch memory snapshots -------------------------------------------------------------- */

static bool snapshot_event(void* arg, int kind, uint64_t addr, uint64_t size, uint64_t stream,
                           uint64_t index) {
  build_t* b = arg;
  return kind == SNAPSHOT_ALLOC ? build_alloc(b, addr, size, stream, index)
                                : build_free(b, addr, stream, index);
}

static bool read_snapshot(build_t* b, gzFile f, const char* first, size_t nfirst) {
  size_t cap = 1 << 20, n = nfirst;
  unsigned char* data = malloc(cap);
  if (!data) return oom(b);
  memcpy(data, first, nfirst);
  for (;;) {
    if (n == cap) {
      if (cap > ((size_t)1 << 34)) {
        free(data);
        fail(b->err, b->errlen, "%s: snapshot larger than 16 GiB", b->path);
        return false;
      }
      unsigned char* v = realloc(data, cap * 2);
      if (!v) {
        free(data);
        return oom(b);
      }
      data = v;
      cap *= 2;
    }
    int got = gzread(f, data + n, (unsigned)(cap - n > (1u << 30) ? (1u << 30) : cap - n));
    if (got < 0) {
      int e;
      fail(b->err, b->errlen, "%s: read error: %s (truncated or corrupt gzip?)", b->path,
           gzerror(f, &e));
      free(data);
      return false;
    }
    if (got == 0) break;
    n += (size_t)got;
  }
  int e;
  gzerror(f, &e);
  if (e != Z_OK && e != Z_STREAM_END) {
    fail(b->err, b->errlen, "%s: read error: %s (truncated or corrupt gzip?)", b->path,
         gzerror(f, &e));
    free(data);
    return false;
  }
  snapshot_info_t info;
  char msg[400] = "";
  b->by_event = true;
  bool ok = snapshot_read(data, n, -1, snapshot_event, b, &info, msg, sizeof msg);
  free(data);
  if (!ok && msg[0]) fail(b->err, b->errlen, "%s: %s", b->path, msg);
  if (ok && info.entries == 0) {
    fail(b->err, b->errlen, "%s: the snapshot's traces are empty (was record_memory_history on?)",
         b->path);
    ok = false;
  }
  return ok;
}

static bool read_gz(gzFile f, const char* path, trace_t* t, char* err, size_t errlen,
                    void (*warn)(const char* msg, void* arg), void* warn_arg);

bool trace_read(const char* path, trace_t* t, char* err, size_t errlen,
                void (*warn)(const char* msg, void* arg), void* warn_arg) {
  memset(t, 0, sizeof *t);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    fail(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
    return false;
  }
  return read_gz(f, path, t, err, errlen, warn, warn_arg);
}

bool trace_read_fd(int fd, const char* name, trace_t* t, char* err, size_t errlen,
                   void (*warn)(const char* msg, void* arg), void* warn_arg) {
  memset(t, 0, sizeof *t);
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    fail(err, errlen, "%s: cannot read", name);
    return false;
  }
  return read_gz(f, name, t, err, errlen, warn, warn_arg);
}

/* Read an opened file (gzclose'd here). */
static bool read_gz(gzFile f, const char* path, trace_t* t, char* err, size_t errlen,
                    void (*warn)(const char* msg, void* arg), void* warn_arg) {
  t->path = strdup(path);
  const char* slash = strrchr(t->path ? t->path : path, '/');
  t->name = slash ? slash + 1 : t->path;
  build_t b = {.t = t, .path = path, .warn = warn, .warn_arg = warn_arg, .err = err,
               .errlen = errlen};
  char line[LINE_MAX_BYTES];
  bool ok = false;
  /* A pickle starts with PROTO (0x80): a PyTorch snapshot; anything else is read as CSV. */
  int first = gzgetc(f);
  if (first == 0x80) {
    line[0] = (char)first;
    ok = read_snapshot(&b, f, line, 1);
  } else if (first < 0) {
    int e;
    const char* zmsg = gzerror(f, &e);
    if (e != Z_OK && e != Z_STREAM_END)
      fail(err, errlen, "%s: cannot read: %s", path, zmsg);
    else
      fail(err, errlen, "%s: empty file (expected RMM's CSV header "
           "'Thread,Time,Action,Pointer,Size,Stream', or a PyTorch memory snapshot)", path);
  } else {
    line[0] = (char)first; /* the rest of the header line follows it */
    line[1] = '\0';
    if (first != '\n' && !gzgets(f, line + 1, sizeof line - 1)) line[1] = '\0';
    ok = read_csv(&b, f, line, sizeof line);
  }
  live_free(&b.live);
  gzclose(f);
  if (!ok) trace_free(t);
  return ok;
}

void trace_free(trace_t* t) {
  free(t->path);
  free(t->events);
  free(t->streams);
  memset(t, 0, sizeof *t);
}
