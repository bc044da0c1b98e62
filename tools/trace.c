/* trace.c: the RMM CSV reader.
 *
 * The format is that of RMM's logging_resource_adaptor:
 *   Thread,Time,Action,Pointer,Size,Stream
 *   0,03:17:27.391041,allocate,0x7f19b4000000,154389504,0x0
 * Columns are found by name in the header. Actions: "allocate", "free", and "allocate
 * failure" (skipped). A free refers to the live allocation at its pointer. zlib reads
 * plain and gzip-compressed files alike.
 */
#include "trace.h"

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

bool trace_read(const char* path, trace_t* t, char* err, size_t errlen,
                void (*warn)(const char* msg, void* arg), void* warn_arg) {
  memset(t, 0, sizeof *t);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    fail(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
    return false;
  }
  t->path = strdup(path);
  const char* slash = strrchr(t->path ? t->path : path, '/');
  t->name = slash ? slash + 1 : t->path;
  live_t live = {0};
  size_t cap = 0;
  char line[LINE_MAX_BYTES];
  uint64_t lineno = 0, cur_live = 0, cur_wraps = 0; /* live sum: cur_wraps * 2^64 + cur_live */
  int col[NCOLS];
  int ncols = 0;
  bool ok = false;
  char* fields[32];

  /* Header */
  if (!gzgets(f, line, sizeof line)) {
    int e;
    const char* zmsg = gzerror(f, &e);
    if (e != Z_OK && e != Z_STREAM_END)
      fail(err, errlen, "%s: cannot read: %s", path, zmsg);
    else
      fail(err, errlen, "%s: empty file (expected RMM's CSV header "
           "'Thread,Time,Action,Pointer,Size,Stream')", path);
    goto done;
  }
  lineno = 1;
  if (read_error(f, line)) {
    int e;
    fail(err, errlen, "%s:1: read error: %s (truncated or corrupt gzip?)", path, gzerror(f, &e));
    goto done;
  }
  chomp(line);
  ncols = split(line, fields, 32);
  for (int c = 0; c < NCOLS; c++) {
    col[c] = -1;
    for (int i = 0; i < ncols && i < 32; i++) {
      char* fld = fields[i];
      while (*fld == ' ') fld++;
      if (strcmp(fld, k_colnames[c]) == 0) col[c] = i;
    }
    if (col[c] < 0) {
      fail(err, errlen, "%s:1: not an RMM log: the header has no '%s' column (expected "
           "'Thread,Time,Action,Pointer,Size,Stream')", path, k_colnames[c]);
      goto done;
    }
  }

  for (;;) {
    if (!gzgets(f, line, sizeof line)) break;
    lineno++;
    if (read_error(f, line)) break; /* reported below */
    size_t len = strlen(line);
    if (len == sizeof line - 1 && line[len - 1] != '\n') {
      fail(err, errlen, "%s:%llu: line longer than %d bytes", path, (unsigned long long)lineno,
           LINE_MAX_BYTES - 2);
      goto done;
    }
    chomp(line);
    if (line[0] == '\0') continue;
    int n = split(line, fields, 32);
    if (n != ncols) {
      fail(err, errlen, "%s:%llu: %d fields, the header has %d", path,
           (unsigned long long)lineno, n > 32 ? 32 : n, ncols);
      goto done;
    }
    const char* action = fields[col[COL_ACTION]];
    uint64_t ptr, size, stream;
    if (!parse_u64(fields[col[COL_POINTER]], 16, &ptr)) {
      fail(err, errlen, "%s:%llu: bad pointer '%s'", path, (unsigned long long)lineno,
           fields[col[COL_POINTER]]);
      goto done;
    }
    if (!parse_u64(fields[col[COL_SIZE]], 10, &size)) {
      fail(err, errlen, "%s:%llu: bad size '%s'", path, (unsigned long long)lineno,
           fields[col[COL_SIZE]]);
      goto done;
    }
    if (!parse_u64(fields[col[COL_STREAM]], 16, &stream)) {
      fail(err, errlen, "%s:%llu: bad stream '%s'", path, (unsigned long long)lineno,
           fields[col[COL_STREAM]]);
      goto done;
    }
    int si = stream_index(t, stream);
    if (si < 0) {
      fail(err, errlen, "%s: out of memory", path);
      goto done;
    }
    trace_event_t e = {.stream = (uint32_t)si, .line = lineno, .ptr = ptr};
    if (strcmp(action, "allocate") == 0) {
      trace_event_t old = e;
      if (live_take(&live, ptr, &old.id, &old.size)) {
        /* The address is still live: its free row is missing. Free it here. */
        if (warn) {
          char msg[256];
          snprintf(msg, sizeof msg, "%s:%llu: allocate of 0x%llx, which is still live; its "
                   "free is missing and is assumed here", path, (unsigned long long)lineno,
                   (unsigned long long)ptr);
          warn(msg, warn_arg);
        }
        old.op = TRACE_FREE;
        if (cur_live < old.size) cur_wraps--;
        cur_live -= old.size;
        t->implicit_frees++;
        if (!push_event(t, &cap, old)) {
          fail(err, errlen, "%s: out of memory", path);
          goto done;
        }
      }
      e.op = TRACE_ALLOC;
      e.id = t->nallocs++;
      e.size = size;
      if (!live_put(&live, ptr, e.id, size)) {
        fail(err, errlen, "%s: out of memory", path);
        goto done;
      }
      cur_live += size;
      if (cur_live < size) cur_wraps++; /* past 2^64: peak_live saturates */
      uint64_t now = cur_wraps ? UINT64_MAX : cur_live;
      if (now > t->peak_live) t->peak_live = now;
    } else if (strcmp(action, "free") == 0) {
      e.op = TRACE_FREE;
      if (!live_take(&live, ptr, &e.id, &e.size)) {
        t->skipped_frees++;
        if (warn) {
          char msg[256];
          snprintf(msg, sizeof msg, "%s:%llu: free of 0x%llx, which is not live in the trace; "
                   "skipped", path, (unsigned long long)lineno, (unsigned long long)ptr);
          warn(msg, warn_arg);
        }
        continue;
      }
      if (cur_live < e.size) cur_wraps--;
      cur_live -= e.size;
    } else if (strcmp(action, "allocate failure") == 0) {
      t->skipped_failures++;
      continue;
    } else {
      fail(err, errlen, "%s:%llu: unknown action '%s' (allocate, free, allocate failure)", path,
           (unsigned long long)lineno, action);
      goto done;
    }
    if (!push_event(t, &cap, e)) {
      fail(err, errlen, "%s: out of memory", path);
      goto done;
    }
  }
  {
    int e;
    const char* zmsg = gzerror(f, &e);
    if (e != Z_OK && e != Z_STREAM_END) {
      fail(err, errlen, "%s:%llu: read error: %s (truncated or corrupt gzip?)", path,
           (unsigned long long)lineno, zmsg);
      goto done;
    }
    if (!gzeof(f)) {
      fail(err, errlen, "%s:%llu: read error", path, (unsigned long long)lineno);
      goto done;
    }
  }
  ok = true;
done:
  live_free(&live);
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
