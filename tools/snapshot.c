/* snapshot.c: reading PyTorch memory snapshots (the pickles torch.cuda.memory._snapshot()
 * makes and _dump_snapshot writes) without Python: a small pickle machine for the opcodes
 * such a pickle uses (protocols 2-5: dicts, lists, tuples, str, int, float, bool, None,
 * the memo), building a tree of values, from which the device traces are read.
 *
 * Every read is bounds-checked and every container and memo index validated: a file that is
 * not such a pickle gets an error naming the byte offset, never a crash. */
#include "snapshot.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { PV_NONE, PV_BOOL, PV_INT, PV_FLOAT, PV_STR, PV_LIST, PV_TUPLE, PV_DICT, PV_MARK } pv_kind_t;

typedef struct pv_s pv_t;
struct pv_s {
  pv_kind_t kind;
  int64_t i;      /* bool, int */
  double f;       /* float */
  char* s;        /* str (NUL-terminated copy), len in n */
  pv_t** items;   /* list, tuple: items; dict: key, value, key, value ... */
  size_t n, cap;
};

typedef struct vm_s {
  const unsigned char* p;
  size_t n, at;
  pv_t** stack;
  size_t sp, stack_cap;
  pv_t** memo;
  size_t nmemo, memo_cap;
  pv_t** all; /* every value made, for freeing */
  size_t nall, all_cap;
  char* err;
  size_t errlen;
} vm_t;

static bool vfail(vm_t* m, const char* fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(m->err, m->errlen, "byte %zu: %s", m->at, msg);
  return false;
}

static bool grow(void** v, size_t* cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 16;
  while (c < need) c *= 2;
  void* w = realloc(*v, c * elem);
  if (!w) return false;
  *v = w;
  *cap = c;
  return true;
}

static pv_t* make(vm_t* m, pv_kind_t kind) {
  if (!grow((void**)&m->all, &m->all_cap, m->nall + 1, sizeof *m->all)) return NULL;
  pv_t* v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->kind = kind;
  m->all[m->nall++] = v;
  return v;
}

static bool push(vm_t* m, pv_t* v) {
  if (!v) return vfail(m, "out of memory");
  if (!grow((void**)&m->stack, &m->stack_cap, m->sp + 1, sizeof *m->stack))
    return vfail(m, "out of memory");
  m->stack[m->sp++] = v;
  return true;
}

static pv_t* pop(vm_t* m) { return m->sp ? m->stack[--m->sp] : NULL; }

static bool need(vm_t* m, size_t k) {
  if (m->n - m->at < k) return vfail(m, "truncated pickle (%zu more bytes needed)", k);
  return true;
}

static uint64_t le(const unsigned char* p, size_t k) {
  uint64_t v = 0;
  for (size_t i = 0; i < k; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static bool add_item(vm_t* m, pv_t* c, pv_t* v) {
  if (!grow((void**)&c->items, &c->cap, c->n + 1, sizeof *c->items)) return vfail(m, "out of memory");
  c->items[c->n++] = v;
  return true;
}

/* The index of the topmost MARK on the stack, or -1. */
static long find_mark(vm_t* m) {
  for (size_t i = m->sp; i > 0; i--) {
    if (m->stack[i - 1]->kind == PV_MARK) return (long)(i - 1);
  }
  return -1;
}

static bool memo_put(vm_t* m, size_t idx, pv_t* v) {
  if (idx > (size_t)1 << 26) return vfail(m, "memo index %zu out of range", idx);
  if (!grow((void**)&m->memo, &m->memo_cap, idx + 1, sizeof *m->memo)) return vfail(m, "out of memory");
  while (m->nmemo <= idx) m->memo[m->nmemo++] = NULL;
  m->memo[idx] = v;
  return true;
}

static bool memo_get(vm_t* m, size_t idx) {
  if (idx >= m->nmemo || !m->memo[idx]) return vfail(m, "memo index %zu was never stored", idx);
  return push(m, m->memo[idx]);
}

static bool run(vm_t* m, pv_t** out) {
  while (m->at < m->n) {
    unsigned char op = m->p[m->at++];
    switch (op) {
      case 0x80: /* PROTO */
        if (!need(m, 1)) return false;
        if (m->p[m->at] < 2 || m->p[m->at] > 5) return vfail(m, "pickle protocol %d", m->p[m->at]);
        m->at++;
        break;
      case 0x95: /* FRAME */
        if (!need(m, 8)) return false;
        m->at += 8;
        break;
      case '.': /* STOP */
        if (m->sp != 1) return vfail(m, "STOP with %zu values on the stack", m->sp);
        *out = pop(m);
        return true;
      case '}': /* EMPTY_DICT */
        if (!push(m, make(m, PV_DICT))) return false;
        break;
      case ']': /* EMPTY_LIST */
        if (!push(m, make(m, PV_LIST))) return false;
        break;
      case ')': /* EMPTY_TUPLE */
        if (!push(m, make(m, PV_TUPLE))) return false;
        break;
      case '(': /* MARK */
        if (!push(m, make(m, PV_MARK))) return false;
        break;
      case 'N':
        if (!push(m, make(m, PV_NONE))) return false;
        break;
      case 0x88: case 0x89: { /* NEWTRUE, NEWFALSE */
        pv_t* v = make(m, PV_BOOL);
        if (v) v->i = op == 0x88;
        if (!push(m, v)) return false;
        break;
      }
      case 'J': case 'K': case 'M': { /* BININT (4, signed), BININT1, BININT2 */
        size_t k = op == 'J' ? 4 : op == 'K' ? 1 : 2;
        if (!need(m, k)) return false;
        pv_t* v = make(m, PV_INT);
        if (v) v->i = op == 'J' ? (int64_t)(int32_t)le(m->p + m->at, 4) : (int64_t)le(m->p + m->at, k);
        m->at += k;
        if (!push(m, v)) return false;
        break;
      }
      case 0x8a: { /* LONG1: n bytes, little-endian two's complement */
        if (!need(m, 1)) return false;
        size_t k = m->p[m->at++];
        if (!need(m, k)) return false;
        if (k > 8) return vfail(m, "integer of %zu bytes", k);
        uint64_t u = le(m->p + m->at, k);
        if (k && k < 8 && (m->p[m->at + k - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * k);
        m->at += k;
        pv_t* v = make(m, PV_INT);
        if (v) v->i = (int64_t)u;
        if (!push(m, v)) return false;
        break;
      }
      case 'G': { /* BINFLOAT: big-endian double */
        if (!need(m, 8)) return false;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u = u << 8 | m->p[m->at + i];
        m->at += 8;
        pv_t* v = make(m, PV_FLOAT);
        if (v) memcpy(&v->f, &u, sizeof u);
        if (!push(m, v)) return false;
        break;
      }
      case 0x8c: case 'X': case 0x8d: { /* SHORT_BINUNICODE, BINUNICODE, BINUNICODE8 */
        size_t lk = op == 0x8c ? 1 : op == 'X' ? 4 : 8;
        if (!need(m, lk)) return false;
        uint64_t len = le(m->p + m->at, lk);
        m->at += lk;
        if (!need(m, len)) return false;
        pv_t* v = make(m, PV_STR);
        if (v && !(v->s = malloc(len + 1))) return vfail(m, "out of memory");
        if (v) {
          memcpy(v->s, m->p + m->at, len);
          v->s[len] = '\0';
          v->n = len;
        }
        m->at += len;
        if (!push(m, v)) return false;
        break;
      }
      case 0x94: /* MEMOIZE */
        if (!m->sp) return vfail(m, "MEMOIZE on an empty stack");
        if (!memo_put(m, m->nmemo, m->stack[m->sp - 1])) return false;
        break;
      case 'q': case 'r': { /* BINPUT, LONG_BINPUT */
        size_t k = op == 'q' ? 1 : 4;
        if (!need(m, k) || !m->sp) return m->sp ? false : vfail(m, "PUT on an empty stack");
        size_t idx = (size_t)le(m->p + m->at, k);
        m->at += k;
        if (!memo_put(m, idx, m->stack[m->sp - 1])) return false;
        break;
      }
      case 'h': case 'j': { /* BINGET, LONG_BINGET */
        size_t k = op == 'h' ? 1 : 4;
        if (!need(m, k)) return false;
        size_t idx = (size_t)le(m->p + m->at, k);
        m->at += k;
        if (!memo_get(m, idx)) return false;
        break;
      }
      case 0x85: case 0x86: case 0x87: { /* TUPLE1, TUPLE2, TUPLE3 */
        size_t k = (size_t)(op - 0x84);
        if (m->sp < k) return vfail(m, "TUPLE%zu with %zu values on the stack", k, m->sp);
        pv_t* t = make(m, PV_TUPLE);
        if (!t) return vfail(m, "out of memory");
        for (size_t i = m->sp - k; i < m->sp; i++)
          if (!add_item(m, t, m->stack[i])) return false;
        m->sp -= k;
        if (!push(m, t)) return false;
        break;
      }
      case 't': case 'e': case 'u': { /* TUPLE, APPENDS, SETITEMS: everything above the MARK */
        long mk = find_mark(m);
        if (mk < 0) return vfail(m, "no MARK");
        size_t first = (size_t)mk + 1, cnt = m->sp - first;
        pv_t* target;
        if (op == 't') {
          target = make(m, PV_TUPLE);
          if (!target) return vfail(m, "out of memory");
        } else {
          if (mk == 0) return vfail(m, "nothing to add to");
          target = m->stack[mk - 1];
          if (op == 'e' && target->kind != PV_LIST) return vfail(m, "APPENDS to a non-list");
          if (op == 'u' && (target->kind != PV_DICT || cnt % 2)) return vfail(m, "bad SETITEMS");
        }
        for (size_t i = first; i < m->sp; i++)
          if (!add_item(m, target, m->stack[i])) return false;
        m->sp = (size_t)mk;
        if (op == 't' && !push(m, target)) return false;
        break;
      }
      case 'a': { /* APPEND */
        if (m->sp < 2 || m->stack[m->sp - 2]->kind != PV_LIST) return vfail(m, "bad APPEND");
        pv_t* v = pop(m);
        if (!add_item(m, m->stack[m->sp - 1], v)) return false;
        break;
      }
      case 's': { /* SETITEM */
        if (m->sp < 3 || m->stack[m->sp - 3]->kind != PV_DICT) return vfail(m, "bad SETITEM");
        pv_t* v = pop(m);
        pv_t* k = pop(m);
        if (!add_item(m, m->stack[m->sp - 1], k) || !add_item(m, m->stack[m->sp - 1], v)) return false;
        break;
      }
      default:
        return vfail(m, "pickle opcode 0x%02x is not one a memory snapshot uses", op);
    }
  }
  return vfail(m, "truncated pickle (no STOP)");
}

static const pv_t* dict_get(const pv_t* d, const char* key) {
  if (!d || d->kind != PV_DICT) return NULL;
  for (size_t i = 0; i + 1 < d->n; i += 2) {
    const pv_t* k = d->items[i];
    if (k->kind == PV_STR && strcmp(k->s, key) == 0) return d->items[i + 1];
  }
  return NULL;
}

static bool as_u64(const pv_t* v, uint64_t* out) {
  if (!v || (v->kind != PV_INT && v->kind != PV_BOOL) || v->i < 0) return false;
  *out = (uint64_t)v->i;
  return true;
}

bool snapshot_read(const unsigned char* data, size_t n, int device, snapshot_event_fn fn,
                   void* arg, snapshot_info_t* info, char* err, size_t errlen) {
  vm_t m = {.p = data, .n = n, .err = err, .errlen = errlen};
  pv_t* root = NULL;
  bool ok = run(&m, &root);
  memset(info, 0, sizeof *info);
  const pv_t* traces = NULL;
  if (ok) {
    traces = dict_get(root, "device_traces");
    if (!traces || traces->kind != PV_LIST) {
      snprintf(err, errlen, "not a PyTorch memory snapshot (no 'device_traces' list%s)",
               dict_get(root, "segments") ? "; record_memory_history was off" : "");
      ok = false;
    }
  }
  if (ok) {
    info->devices = traces->n;
    if (device < 0) { /* the first device with events */
      device = 0;
      for (size_t d = 0; d < traces->n; d++) {
        if (traces->items[d]->kind == PV_LIST && traces->items[d]->n) {
          device = (int)d;
          break;
        }
      }
    }
    info->device = device;
    if ((size_t)device >= traces->n || traces->items[device]->kind != PV_LIST) {
      snprintf(err, errlen, "the snapshot has no trace for device %d (%zu devices)", device,
               traces->n);
      ok = false;
    }
  }
  if (ok) {
    const pv_t* list = traces->items[device];
    for (size_t i = 0; i < list->n && ok; i++) {
      const pv_t* e = list->items[i];
      const pv_t* action = dict_get(e, "action");
      if (!action || action->kind != PV_STR) {
        snprintf(err, errlen, "event %zu: no 'action'", i + 1);
        ok = false;
        break;
      }
      info->entries++;
      int kind = strcmp(action->s, "alloc") == 0 ? SNAPSHOT_ALLOC
                 : strcmp(action->s, "free_completed") == 0 ? SNAPSHOT_FREE : -1;
      if (kind < 0) continue; /* free_requested, segment_*, oom, snapshot: not calls */
      uint64_t addr, size, stream = 0;
      if (!as_u64(dict_get(e, "addr"), &addr) || !as_u64(dict_get(e, "size"), &size)) {
        snprintf(err, errlen, "event %zu (%s): no valid 'addr' and 'size'", i + 1, action->s);
        ok = false;
        break;
      }
      as_u64(dict_get(e, "stream"), &stream);
      ok = fn(arg, kind, addr, size, stream, i + 1);
    }
  }
  for (size_t i = 0; i < m.nall; i++) {
    free(m.all[i]->s);
    free(m.all[i]->items);
    free(m.all[i]);
  }
  free(m.all);
  free(m.stack);
  free(m.memo);
  return ok;
}
