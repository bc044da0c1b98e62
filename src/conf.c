/* conf.c: heap configuration - defaults, STASH_CONF parsing, validation and formatting.
 *
 * The grammar is PyTorch's PYTORCH_CUDA_ALLOC_CONF: the text is split into tokens at
 * ',' ':' '[' ']' (whitespace is dropped, not a separator), entries are key:value separated
 * by commas, and a list value is [a:b,c:d]. Each key is declared once, in the table below,
 * with its parser. Unlike PyTorch, numbers must be whole tokens ("20abc" is an error, not 20).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MB ((size_t)1 << 20)
#define LARGE_BUFFER_MB 20 /* kLargeBuffer / 1 MiB: the default large segment */
#define MAX_TOKENS 256

void stash_conf_init(stash_conf_t* c) {
  memset(c, 0, sizeof *c);
  c->size = sizeof *c;
  c->version = STASH_CONF_VERSION;
  c->policy = STASH_POLICY_STASH;
  c->max_split_size = SIZE_MAX;
  c->max_non_split_rounding = LARGE_BUFFER_MB * MB;
  c->large_segment_size = LARGE_BUFFER_MB * MB;
  c->garbage_collection_threshold = 0.0;
  c->per_process_memory_fraction = 1.0;
  c->expandable_segments = false;
  c->stream_waits = true;
}

const char* _stash_policy_name(stash_policy_t p) {
  switch (p) {
    case STASH_POLICY_PYTORCH:
      return "pytorch";
    case STASH_POLICY_STASH:
      return "stash";
    default:
      return "?";
  }
}

/* ---- Tokens ------------------------------------------------------------------------- */

typedef struct lexer_s {
  char* tok[MAX_TOKENS];
  size_t n;
  char* storage;
} lexer_t;

static bool is_punct(char ch) { return ch == ',' || ch == ':' || ch == '[' || ch == ']'; }

static stash_status_t lex(const char* text, lexer_t* lx) {
  size_t len = strlen(text);
  /* Each token is followed by a NUL: at most 2 bytes per input byte. */
  lx->storage = malloc(2 * len + 2);
  lx->n = 0;
  if (!lx->storage) return _stash_error(STASH_ERR_HOST_OOM, "STASH_CONF: out of host memory");
  char* out = lx->storage;
  char* start = NULL;
  for (size_t i = 0; i <= len; i++) {
    char ch = text[i];
    if (isspace((unsigned char)ch)) continue; /* dropped, as PyTorch: "1 00" reads "100" */
    bool end = ch == '\0' || is_punct(ch);
    if (end) {
      if (start) {
        *out++ = '\0';
        start = NULL;
      }
      if (end && ch != '\0') {
        if (lx->n == MAX_TOKENS) goto too_long;
        lx->tok[lx->n++] = out;
        *out++ = ch;
        *out++ = '\0';
      }
      continue;
    }
    if (!start) {
      if (lx->n == MAX_TOKENS) goto too_long;
      start = out;
      lx->tok[lx->n++] = out;
    }
    *out++ = ch;
  }
  return STASH_OK;
too_long:
  free(lx->storage);
  lx->storage = NULL;
  return _stash_error(STASH_ERR_CONF, "STASH_CONF: more than %d tokens", MAX_TOKENS);
}

static bool tok_is(const lexer_t* lx, size_t i, const char* s) {
  return i < lx->n && strcmp(lx->tok[i], s) == 0;
}

/* ---- Value parsers -------------------------------------------------------------------- */

static bool parse_uint(const char* s, unsigned long long* out) {
  if (!*s || !isdigit((unsigned char)s[0])) return false;
  errno = 0;
  char* end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

static bool parse_double(const char* s, double* out) {
  if (!*s) return false;
  errno = 0;
  char* end;
  double v = strtod(s, &end);
  if (errno || *end || isnan(v)) return false;
  *out = v;
  return true;
}

static bool is_pow2(unsigned long long v) { return v && !(v & (v - 1)); }

/* A parser reads the value at lx->tok[*i] (and beyond, for lists), leaving *i on its last
 * token, and writes into c. */
typedef stash_status_t (*parse_fn)(const char* key, const lexer_t* lx, size_t* i,
                                   stash_conf_t* c);

static stash_status_t bad_value(const char* key, const char* value, const char* why) {
  return _stash_error(STASH_ERR_CONF, "STASH_CONF: %s: invalid value '%s': %s", key, value,
                      why);
}

static stash_status_t parse_policy(const char* key, const lexer_t* lx, size_t* i,
                                   stash_conf_t* c) {
  const char* v = lx->tok[*i];
  if (strcmp(v, "pytorch") == 0) {
    c->policy = STASH_POLICY_PYTORCH;
    return STASH_OK;
  }
  if (strcmp(v, "stash") == 0) {
    c->policy = STASH_POLICY_STASH;
    return STASH_OK;
  }
  return bad_value(key, v, "the policies are: stash, pytorch");
}

static stash_status_t parse_mb(const char* key, const char* v, size_t min_mb, size_t* out) {
  unsigned long long mb;
  if (!parse_uint(v, &mb)) return bad_value(key, v, "expected a whole number of MiB");
  if (mb < min_mb) {
    char why[64];
    snprintf(why, sizeof why, "must be >= %zu", min_mb);
    return bad_value(key, v, why);
  }
  if (mb > SIZE_MAX / MB) mb = SIZE_MAX / MB;
  *out = (size_t)mb * MB;
  return STASH_OK;
}

/* Both must be >= large_segment_size_mb (20 by default), checked once all keys are read. */
static stash_status_t parse_max_split(const char* key, const lexer_t* lx, size_t* i,
                                      stash_conf_t* c) {
  return parse_mb(key, lx->tok[*i], 11, &c->max_split_size);
}

static stash_status_t parse_max_non_split(const char* key, const lexer_t* lx, size_t* i,
                                          stash_conf_t* c) {
  return parse_mb(key, lx->tok[*i], 11, &c->max_non_split_rounding);
}

static stash_status_t parse_large_segment(const char* key, const lexer_t* lx, size_t* i,
                                          stash_conf_t* c) {
  size_t v = 0;
  stash_status_t st = parse_mb(key, lx->tok[*i], 11, &v); /* PyTorch: must be > 10 */
  if (st != STASH_OK) return st;
  if (v % (2 * MB)) return bad_value(key, lx->tok[*i], "must be a multiple of 2 (pages)");
  c->large_segment_size = v;
  return STASH_OK;
}

static stash_status_t parse_max_piece(const char* key, const lexer_t* lx, size_t* i,
                                      stash_conf_t* c) {
  return parse_mb(key, lx->tok[*i], 2, &c->max_piece_size); /* 2 MiB: a page of the H200 */
}

static stash_status_t parse_gc(const char* key, const lexer_t* lx, size_t* i, stash_conf_t* c) {
  double v;
  if (!parse_double(lx->tok[*i], &v)) return bad_value(key, lx->tok[*i], "expected a number");
  if (!(v > 0.0 && v < 1.0)) return bad_value(key, lx->tok[*i], "must be in (0.0, 1.0)");
  c->garbage_collection_threshold = v;
  return STASH_OK;
}

static stash_status_t parse_fraction(const char* key, const lexer_t* lx, size_t* i,
                                     stash_conf_t* c) {
  double v;
  if (!parse_double(lx->tok[*i], &v)) return bad_value(key, lx->tok[*i], "expected a number");
  if (!(v >= 0.0 && v <= 1.0)) return bad_value(key, lx->tok[*i], "must be in [0.0, 1.0]");
  c->per_process_memory_fraction = v;
  return STASH_OK;
}

static stash_status_t parse_bool(const char* key, const char* v, bool* out) {
  if (strcmp(v, "True") == 0) *out = true;
  else if (strcmp(v, "False") == 0) *out = false;
  else return bad_value(key, v, "expected True or False");
  return STASH_OK;
}

static stash_status_t parse_expandable(const char* key, const lexer_t* lx, size_t* i,
                                       stash_conf_t* c) {
  return parse_bool(key, lx->tok[*i], &c->expandable_segments);
}

static stash_status_t parse_stream_waits(const char* key, const lexer_t* lx, size_t* i,
                                         stash_conf_t* c) {
  return parse_bool(key, lx->tok[*i], &c->stream_waits);
}

static stash_status_t parse_ignored_bool(const char* key, const lexer_t* lx, size_t* i,
                                         stash_conf_t* c) {
  (void)c;
  bool b;
  return parse_bool(key, lx->tok[*i], &b);
}

static stash_status_t parse_backend(const char* key, const lexer_t* lx, size_t* i,
                                    stash_conf_t* c) {
  (void)c;
  if (strcmp(lx->tok[*i], "native") == 0) return STASH_OK;
  return bad_value(key, lx->tok[*i], "stash is a native caching allocator: only 'native'");
}

static stash_status_t parse_roundup(const char* key, const lexer_t* lx, size_t* i,
                                    stash_conf_t* c) {
  uint32_t div[STASH_ROUNDUP_BUCKETS];
  memcpy(div, c->roundup_power2_divisions, sizeof div);
  const char* v = lx->tok[*i];
  if (strcmp(v, "[") != 0) {
    unsigned long long d;
    if (!parse_uint(v, &d) || !is_pow2(d) || d > (1u << 30))
      return bad_value(key, v, "the number of divisions must be a power of 2");
    for (int b = 0; b < STASH_ROUNDUP_BUCKETS; b++) div[b] = (uint32_t)d;
    memcpy(c->roundup_power2_divisions, div, sizeof div);
    return STASH_OK;
  }
  /* [MB:div, ..., >:div] - as PyTorch 2.11: the first key also fills the buckets below it,
   * '>' fills every bucket after the last key given (from last_index + 1, so from bucket 1
   * when no key came before it). */
  bool first = true;
  size_t last_index = 0;
  size_t k = *i + 1;
  if (tok_is(lx, k, "]")) { /* an empty list changes nothing, as in PyTorch */
    *i = k;
    return STASH_OK;
  }
  for (;;) {
    if (k >= lx->n) return bad_value(key, "[", "missing ']'");
    const char* interval = lx->tok[k];
    if (!tok_is(lx, k + 1, ":") || k + 2 >= lx->n)
      return bad_value(key, interval, "expected MB:divisions");
    const char* dv = lx->tok[k + 2];
    unsigned long long d;
    if (!parse_uint(dv, &d) || (d != 0 && !is_pow2(d)) || d > (1u << 30))
      return bad_value(key, dv, "divisions must be 0 or a power of 2");
    if (strcmp(interval, ">") == 0) {
      for (size_t b = last_index + 1; b < STASH_ROUNDUP_BUCKETS; b++) div[b] = (uint32_t)d;
    } else {
      unsigned long long mb;
      if (!parse_uint(interval, &mb) || !is_pow2(mb))
        return bad_value(key, interval, "intervals must be powers of 2 (in MiB)");
      size_t index = 0;
      while ((1ULL << (index + 1)) <= mb) index++;
      if (index > STASH_ROUNDUP_BUCKETS - 1) index = STASH_ROUNDUP_BUCKETS - 1;
      if (first) {
        for (size_t b = 0; b < index; b++) div[b] = (uint32_t)d;
        first = false;
      }
      div[index] = (uint32_t)d;
      last_index = index;
    }
    k += 3;
    if (tok_is(lx, k, "]")) break;
    if (!tok_is(lx, k, ",")) return bad_value(key, lx->tok[k < lx->n ? k : k - 1], "expected ',' or ']'");
    k++;
  }
  *i = k;
  memcpy(c->roundup_power2_divisions, div, sizeof div);
  return STASH_OK;
}

/* ---- The option table ----------------------------------------------------------------- */

static const struct option_s {
  const char* name;
  parse_fn parse;
  const char* doc;
} k_options[] = {
    {"policy", parse_policy, "allocation policy: stash or pytorch (=stash)"},
    {"max_split_size_mb", parse_max_split,
     "blocks this large or larger are never split (MiB, >= 20; =unlimited)"},
    {"max_non_split_rounding_mb", parse_max_non_split,
     "how much larger an unsplit oversize block may be than its request (MiB, >= 20; =20)"},
    {"large_segment_size_mb", parse_large_segment,
     "segment size for 1-10 MiB requests and expandable page size (MiB, > 10; =20)"},
    {"roundup_power2_divisions", parse_roundup,
     "round sizes up to one of N divisions of a power of 2: N or [MB:N,...,>:N] (=0)"},
    {"garbage_collection_threshold", parse_gc,
     "free old cached segments above this fraction of the limit (0..1; =0: off)"},
    {"per_process_memory_fraction", parse_fraction,
     "limit reserved memory to this fraction of the device (0..1; =1)"},
    {"expandable_segments", parse_expandable,
     "grow segments by mapping pages into reserved address ranges (True/False; =False)"},
    {"max_piece_size_mb", parse_max_piece,
     "policy:stash: no physical allocation larger, for runs at the device's limit (MiB, >= 2; "
     "=the policy's own)"},
    {"stream_waits", parse_stream_waits,
     "policy:stash: a stream may wait on the device for another stream's work, to take memory "
     "that stream freed, rather than grow (True/False; =True)"},
    {"backend", parse_backend, "accepted for compatibility: native"},
    {"release_lock_on_cudamalloc", parse_ignored_bool,
     "accepted for compatibility (True/False); stash holds its lock"},
};

static const struct option_s* find_option(const char* name) {
  for (size_t i = 0; i < sizeof k_options / sizeof k_options[0]; i++) {
    if (strcmp(k_options[i].name, name) == 0) return &k_options[i];
  }
  return NULL;
}

/* The first key set away from its default that only policy:pytorch reads, or NULL. */
static const char* pytorch_only_key(const stash_conf_t* c) {
  stash_conf_t d;
  stash_conf_init(&d);
  if (c->max_split_size != d.max_split_size) return "max_split_size_mb";
  if (c->large_segment_size != d.large_segment_size) return "large_segment_size_mb";
  if (c->max_non_split_rounding != d.max_non_split_rounding) return "max_non_split_rounding_mb";
  if (memcmp(c->roundup_power2_divisions, d.roundup_power2_divisions,
             sizeof d.roundup_power2_divisions) != 0)
    return "roundup_power2_divisions";
  if (c->garbage_collection_threshold != d.garbage_collection_threshold)
    return "garbage_collection_threshold";
  if (c->expandable_segments != d.expandable_segments) return "expandable_segments";
  return NULL;
}

stash_status_t _stash_conf_validate(const stash_conf_t* c) {
  if (!c || c->size < sizeof *c || c->version != STASH_CONF_VERSION)
    return _stash_error(STASH_ERR_CONF, "configuration struct of unknown size or version");
  if (c->policy < 0 || c->policy >= _STASH_POLICY_LAST)
    return _stash_error(STASH_ERR_CONF, "unknown policy %d", (int)c->policy);
  if (c->large_segment_size <= 10 * MB || c->large_segment_size % (2 * MB))
    return _stash_error(STASH_ERR_CONF,
                        "large_segment_size_mb: %zu MiB: must be a multiple of 2 above 10",
                        c->large_segment_size / MB);
  if (c->max_split_size < c->large_segment_size)
    return _stash_error(STASH_ERR_CONF,
                        "STASH_CONF: max_split_size_mb: invalid value '%zu': must be >= %zu "
                        "(large_segment_size_mb)",
                        c->max_split_size / MB, c->large_segment_size / MB);
  if (c->max_non_split_rounding < c->large_segment_size)
    return _stash_error(STASH_ERR_CONF,
                        "STASH_CONF: max_non_split_rounding_mb: invalid value '%zu': must be >= "
                        "%zu (large_segment_size_mb)",
                        c->max_non_split_rounding / MB, c->large_segment_size / MB);
  if (!(c->garbage_collection_threshold >= 0.0 && c->garbage_collection_threshold < 1.0))
    return _stash_error(STASH_ERR_CONF, "garbage_collection_threshold must be in [0, 1)");
  if (!(c->per_process_memory_fraction >= 0.0 && c->per_process_memory_fraction <= 1.0))
    return _stash_error(STASH_ERR_CONF, "per_process_memory_fraction must be in [0, 1]");
  for (int b = 0; b < STASH_ROUNDUP_BUCKETS; b++) {
    uint32_t d = c->roundup_power2_divisions[b];
    if (d && !is_pow2(d))
      return _stash_error(STASH_ERR_CONF, "roundup_power2_divisions must be powers of 2");
  }
  if (c->policy == STASH_POLICY_STASH) {
    const char* key = pytorch_only_key(c);
    if (key)
      return _stash_error(STASH_ERR_CONF,
                          "STASH_CONF: %s configures policy:pytorch; policy:stash (the default) "
                          "takes only per_process_memory_fraction, max_piece_size_mb and "
                          "stream_waits - add policy:pytorch to use it",
                          key);
  }
  if (c->policy == STASH_POLICY_PYTORCH && (c->max_piece_size || !c->stream_waits))
    return _stash_error(STASH_ERR_CONF,
                        "STASH_CONF: %s configures policy:stash; policy:pytorch makes the "
                        "allocations PyTorch makes",
                        c->max_piece_size ? "max_piece_size_mb" : "stream_waits");
  return STASH_OK;
}

stash_status_t stash_conf_parse(stash_conf_t* conf, const char* text) {
  if (!conf) return _stash_error(STASH_ERR_INVALID, "stash_conf_parse: conf is NULL");
  if (!text || !*text) return STASH_OK;
  lexer_t lx;
  stash_status_t st = lex(text, &lx);
  if (st != STASH_OK) return st;
  stash_conf_t c = *conf;
  bool saw_large = false, saw_non_split = false;
  for (size_t i = 0; i < lx.n; i++) {
    const char* key = lx.tok[i];
    if (is_punct(key[0]) && key[1] == '\0') {
      st = _stash_error(STASH_ERR_CONF, "STASH_CONF: expected a key, found '%s' in \"%s\"",
                        key, text);
      break;
    }
    const struct option_s* opt = find_option(key);
    if (!opt) {
      char keys[512]; /* every key of the table, so the message cannot leave one out */
      size_t used = 0;
      keys[0] = '\0';
      for (size_t k = 0; k < sizeof k_options / sizeof k_options[0] && used < sizeof keys; k++)
        used += (size_t)snprintf(keys + used, sizeof keys - used, "%s%s", k ? ", " : "",
                                 k_options[k].name);
      st = _stash_error(STASH_ERR_CONF, "STASH_CONF: unknown key '%s' (keys: %s)", key, keys);
      break;
    }
    if (!tok_is(&lx, i + 1, ":") || i + 2 >= lx.n || tok_is(&lx, i + 2, ",")) {
      st = _stash_error(STASH_ERR_CONF, "STASH_CONF: %s: expected '%s:value'", key, key);
      break;
    }
    i += 2;
    saw_large |= opt->parse == parse_large_segment;
    saw_non_split |= opt->parse == parse_max_non_split;
    st = opt->parse(key, &lx, &i, &c);
    if (st != STASH_OK) break;
    if (i + 1 < lx.n) {
      if (!tok_is(&lx, i + 1, ",")) {
        st = _stash_error(STASH_ERR_CONF, "STASH_CONF: %s: expected ',' after its value, found '%s'",
                          key, lx.tok[i + 1]);
        break;
      }
      i++;
      if (i + 1 >= lx.n) {
        st = _stash_error(STASH_ERR_CONF, "STASH_CONF: trailing ',' in \"%s\"", text);
        break;
      }
    }
  }
  free(lx.storage);
  /* As PyTorch 2.11: a large segment size is also the default non-split rounding. */
  if (st == STASH_OK && saw_large && !saw_non_split) c.max_non_split_rounding = c.large_segment_size;
  if (st == STASH_OK) st = _stash_conf_validate(&c);
  if (st == STASH_OK) *conf = c;
  return st;
}

/* ---- Formatting ------------------------------------------------------------------------ */

/* The shortest %g text that reads back as v. */
static void shortest_double(double v, char* out, size_t n) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(out, n, "%.*g", prec, v);
    if (strtod(out, NULL) == v) return;
  }
}

size_t stash_conf_format(const stash_conf_t* c, char* buf, size_t n) {
  stash_conf_t d;
  stash_conf_init(&d);
  size_t len = 0;
  if (n) buf[0] = '\0';
  _stash_appendf(buf, n, &len, "policy:%s", _stash_policy_name(c->policy));
  if (c->max_split_size != d.max_split_size)
    _stash_appendf(buf, n, &len, ",max_split_size_mb:%zu", c->max_split_size / MB);
  if (c->max_non_split_rounding != d.max_non_split_rounding)
    _stash_appendf(buf, n, &len, ",max_non_split_rounding_mb:%zu",
                   c->max_non_split_rounding / MB);
  if (c->large_segment_size != d.large_segment_size)
    _stash_appendf(buf, n, &len, ",large_segment_size_mb:%zu", c->large_segment_size / MB);
  if (memcmp(c->roundup_power2_divisions, d.roundup_power2_divisions,
             sizeof d.roundup_power2_divisions) != 0) {
    _stash_appendf(buf, n, &len, ",roundup_power2_divisions:[");
    for (int b = 0; b < STASH_ROUNDUP_BUCKETS; b++) {
      _stash_appendf(buf, n, &len, "%s%llu:%u", b ? "," : "", 1ULL << b,
                     c->roundup_power2_divisions[b]);
    }
    _stash_appendf(buf, n, &len, "]");
  }
  char num[40];
  if (c->garbage_collection_threshold != d.garbage_collection_threshold) {
    shortest_double(c->garbage_collection_threshold, num, sizeof num);
    _stash_appendf(buf, n, &len, ",garbage_collection_threshold:%s", num);
  }
  if (c->per_process_memory_fraction != d.per_process_memory_fraction) {
    shortest_double(c->per_process_memory_fraction, num, sizeof num);
    _stash_appendf(buf, n, &len, ",per_process_memory_fraction:%s", num);
  }
  if (c->expandable_segments) _stash_appendf(buf, n, &len, ",expandable_segments:True");
  if (c->max_piece_size)
    _stash_appendf(buf, n, &len, ",max_piece_size_mb:%zu", c->max_piece_size / MB);
  if (!c->stream_waits) _stash_appendf(buf, n, &len, ",stream_waits:False");
  return len;
}
