/* stash-replay: replay allocation traces through stash on a simulated device and report
 * what each configuration reserves.
 *
 *   stash-replay [--conf STR]... [--capacity SIZE] [--json [--series N]] [--check N]
 *                [--html FILE] [--explain FILE] [--calls FILE]
 *                [--trace-addresses] [--empty-cache-between-steps] [--lag N]
 *                [--provider sim|cuda]
 *                [--device N] [--driver-check]
 *                [TRACE...]
 *
 * With no trace, it replays the ResNet-50 trace shipped with stash under policy:stash and
 * the four PyTorch settings users try: default, expandable segments, max_split_size_mb and
 * roundup_power2_divisions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "html.h"
#include "replay.h"
#include "stash.h"
#include "stash_provider.h"
#include "trace.h"

#ifndef STASH_DATA_DIR
#define STASH_DATA_DIR "data"
#endif

#define MAX_CONFS 64

static uint64_t g_series_points; /* --series N */

static void usage(FILE* f) {
  fprintf(f,
          "usage: stash-replay [options] [TRACE...]\n"
          "\n"
          "Replays allocation traces - RMM's CSV log, or a PyTorch memory snapshot\n"
          "(torch.cuda.memory._snapshot() pickled), plain or gzip - through stash on a\n"
          "simulated device and reports, per configuration, the memory it reserves.\n"
          "\n"
          "options:\n"
          "  --conf STR       a configuration in STASH_CONF's grammar, e.g.\n"
          "                   'policy:pytorch,expandable_segments:True' (repeatable; each is\n"
          "                   replayed and reported side by side)\n"
          "  --capacity SIZE  the simulated device's memory (default 150109880320, an H200);\n"
          "                   K/M/G/T suffixes, optional iB: 80GiB\n"
          "  --json           one JSON object per line per (trace, configuration)\n"
          "  --check N        every N events: check every heap invariant and (simulated)\n"
          "                   that every live allocation is usable memory sharing no byte,\n"
          "                   virtual or physical, with another (slow)\n"
          "  --trace-addresses  simulated: put each new segment (a plain cudaMalloc) where the\n"
          "                   traced program got the allocation that made it, if that range is\n"
          "                   free: the traced process's driver layout instead of a fresh\n"
          "                   process's (PyTorch breaks ties between free blocks by address)\n"
          "  --empty-cache-between-steps  call empty_cache whenever live bytes fall under a\n"
          "                   quarter of their peak so far, having been over half of it since\n"
          "                   the last call: between training steps, as a program calling\n"
          "                   torch.cuda.empty_cache() after each step does\n"
          "  --lag N          simulated: the GPU runs N events behind the host - after\n"
          "                   each event, the work queued on each stream up to N events ago\n"
          "                   has completed (default 0: all of it, by the next event); memory\n"
          "                   one stream frees reaches the others that much later\n"
          "  --provider P     sim (default): the simulated device; cuda: a real GPU\n"
          "  --device N       the GPU to replay on, with --provider cuda (default 0)\n"
          "  --driver-check   with cuda: read the driver's memory in use (cuMemGetInfo)\n"
          "                   whenever reserved bytes change and report how far apart they are\n"
          "  --html FILE      also write a self-contained HTML page: per configuration, live\n"
          "                   and reserved bytes over the trace and the memory at the peak\n"
          "  --series N       with --json: add live and reserved bytes over the trace, N points\n"
          "                   (simulated: and the modelled driver time so far, us)\n"
          "  --explain FILE   write there, per trace and configuration, every allocation that\n"
          "                   made reserved bytes grow (or ran out of memory): its size, reserved\n"
          "                   before and after, live bytes, and the free blocks of its pool just\n"
          "                   before it (how many, how much, the largest): why it did not fit;\n"
          "                   then, per pool, where the reserved bytes were when they first\n"
          "                   reached their peak: live, rounding, pending free, lent to\n"
          "                   stitched blocks, holes, free at segment ends ('-': stderr)\n"
          "  --calls FILE     write there, per trace and configuration, every event that made\n"
          "                   provider calls, with their kinds, bytes and modelled cost (with\n"
          "                   --provider cuda: measured wall time), and the running total;\n"
          "                   then the totals by kind, by tenth of the trace, and the costliest\n"
          "                   events: where driver ms went ('-': stderr)\n"
          "                   (an --html, --explain or --calls FILE that is one of the traces,\n"
          "                   an existing trace file, a name beginning with '-', or another\n"
          "                   output's file, is refused: nothing is written)\n"
          "  -h, --help       this text\n"
          "\n"
          "With no trace: %s/traces/resnet50_train.csv.gz under policy:stash and\n"
          "policy:pytorch with its default, expandable_segments:True, max_split_size_mb:200\n"
          "and roundup_power2_divisions:4 (no --conf: the same list for any trace).\n",
          STASH_DATA_DIR);
}

static void warn_cb(const char* msg, void* arg) {
  (void)arg;
  fprintf(stderr, "stash-replay: warning: %s\n", msg);
}

static void json_string(const char* s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static void print_series(const replay_result_t* r, uint64_t events, uint64_t points);

static void print_json(const trace_t* t, const char* conf, const char* provider,
                       const replay_result_t* r) {
  printf("{\"trace\": ");
  json_string(t->name);
  printf(", \"conf\": ");
  json_string(conf);
  printf(", \"provider\": ");
  json_string(provider);
  printf(", \"events\": %llu, \"streams\": %zu, \"peak_live_bytes\": %llu, "
         "\"peak_reserved_bytes\": %llu, \"peak_allocated_bytes\": %llu, "
         "\"peak_active_bytes\": %llu, \"utilization\": %.6f, \"device_allocs\": %llu, "
         "\"device_frees\": %llu, \"alloc_retries\": %llu, \"ooms\": %llu, "
         "\"ns_per_event\": %.1f",
         (unsigned long long)r->events, t->nstreams, (unsigned long long)r->peak_live_bytes,
         (unsigned long long)r->peak_reserved_bytes, (unsigned long long)r->peak_allocated_bytes,
         (unsigned long long)r->peak_active_bytes,
         r->peak_reserved_bytes ? (double)r->peak_live_bytes / (double)r->peak_reserved_bytes : 0.0,
         (unsigned long long)r->device_allocs, (unsigned long long)r->device_frees,
         (unsigned long long)r->alloc_retries, (unsigned long long)r->ooms, r->ns_per_event);
  printf(", \"empty_caches\": %llu", (unsigned long long)r->empty_caches);
  /* The driver time is modelled by the simulated device (null on a real one: nothing was
   * modelled), and measured on a real one (timed_provider.h); the provider calls, and those
   * of the second half, are counted on both. */
  bool sim = !strcmp(provider, "sim");
  if (sim)
    printf(", \"lag_events\": %llu, \"modeled_driver_us\": %.1f", (unsigned long long)r->lag,
           r->modeled_driver_us);
  else
    printf(", \"modeled_driver_us\": null, \"measured_driver_us\": %.1f", r->measured_driver_us);
  printf(", \"device_allocs_second_half\": %llu, \"device_frees_second_half\": %llu",
         (unsigned long long)r->device_allocs_second_half,
         (unsigned long long)r->device_frees_second_half);
  /* every kind of call made: how many, and their modelled cost (measured on a GPU) */
  printf(", \"%s\": {", sim ? "calls" : "measured_calls");
  const char* sep = "";
  for (int k = 0; k < STASH_CALL_COUNT; k++) {
    if (!r->calls[k]) continue;
    printf("%s\"%s\": [%llu, %.1f]", sep, stash_provider_call_name((stash_provider_call_t)k),
           (unsigned long long)r->calls[k], r->driver_us[k]);
    sep = ", ";
  }
  printf("}");
  if (r->ooms)
    printf(", \"first_oom_line\": %llu, \"first_oom_event\": %llu, \"first_oom_size\": %llu, "
           "\"first_oom_live_bytes\": %llu, \"first_oom_live_allocations\": %llu",
           (unsigned long long)r->first_oom_line, (unsigned long long)r->first_oom_event,
           (unsigned long long)r->first_oom_size, (unsigned long long)r->first_oom_live_bytes,
           (unsigned long long)r->first_oom_live_count);
  print_series(r, r->events, g_series_points);
  if (r->driver_checked)
    printf(", \"driver_checks\": %llu, \"driver_used_at_peak_bytes\": %llu, "
           "\"driver_gap_max_bytes\": %lld",
           (unsigned long long)r->driver_checks, (unsigned long long)r->driver_used_at_peak,
           (long long)r->driver_gap_max);
  printf("}\n");
  fflush(stdout);
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static void print_table_header(const trace_t* t, uint64_t lag) {
  printf("\n%s: %zu events, %zu stream%s, peak live %llu bytes (%.2f GiB)", t->name,
         t->nevents, t->nstreams, t->nstreams == 1 ? "" : "s",
         (unsigned long long)t->peak_live, gib(t->peak_live));
  if (lag) printf("; a GPU %llu events behind", (unsigned long long)lag);
  printf("\n");
  printf("  %-44s %15s %9s %6s %9s %9s %7s %7s %9s %6s %5s %9s\n", "configuration",
         "peak reserved", "GiB", "util", "wasted", "live GiB", "dev+", "dev-", "driver ms",
         "late", "OOMs", "ns/event");
}

/* modeled: the driver time is the simulated device's model (else measured on a GPU). */
static void print_table_row(const char* conf, const replay_result_t* r, bool best, bool modeled) {
  double util = r->peak_reserved_bytes ? 100.0 * (double)r->peak_live_bytes /
                                             (double)r->peak_reserved_bytes
                                       : 0.0;
  uint64_t wasted = r->peak_reserved_bytes > r->peak_live_bytes
                        ? r->peak_reserved_bytes - r->peak_live_bytes : 0;
  char driver[32], late[32];
  snprintf(driver, sizeof driver, "%.2f",
           (modeled ? r->modeled_driver_us : r->measured_driver_us) / 1000.0);
  snprintf(late, sizeof late, "%llu",
           (unsigned long long)(r->device_allocs_second_half + r->device_frees_second_half));
  printf("%c %-44s %15llu %9.2f %5.1f%% %9.2f %9.2f %7llu %7llu %9s %6s %5llu %9.0f\n",
         best ? '*' : ' ', conf, (unsigned long long)r->peak_reserved_bytes,
         gib(r->peak_reserved_bytes), util, gib(wasted), gib(r->peak_live_bytes),
         (unsigned long long)r->device_allocs, (unsigned long long)r->device_frees, driver, late,
         (unsigned long long)r->ooms, r->ns_per_event);
}

static void size_text(uint64_t b, char* out, size_t n) {
  if (b >= (1ull << 30)) snprintf(out, n, "%.2f GiB", gib(b));
  else if (b >= (1ull << 20)) snprintf(out, n, "%.2f MiB", (double)b / 1048576.0);
  else snprintf(out, n, "%llu bytes", (unsigned long long)b);
}

/* Whether the trace fit, and if not where it ran out and what was live then. */
static void print_capacity(const char* conf, const replay_result_t* r, uint64_t capacity) {
  char cap[32];
  size_text(capacity, cap, sizeof cap);
  if (!r->ooms) {
    if (capacity) printf("  %s: fits in %s (peak reserved %.2f GiB)\n", conf, cap,
                         gib(r->peak_reserved_bytes));
    return;
  }
  char want[32], live[32];
  size_text(r->first_oom_size, want, sizeof want);
  size_text(r->first_oom_live_bytes, live, sizeof live);
  printf("  %s: %llu allocations ran out of memory, the first at line %llu (event %llu): it "
         "asked for %s with %s live in %llu allocations%s%s\n", conf,
         (unsigned long long)r->ooms, (unsigned long long)r->first_oom_line,
         (unsigned long long)r->first_oom_event, want, live,
         (unsigned long long)r->first_oom_live_count, capacity ? "; does not fit in " : "",
         capacity ? cap : "");
}

/* A progress bar on stderr, for long traces when stderr is a terminal. */
typedef struct progress_s {
  const char* what;
  int last;
} progress_t;

static void progress_cb(uint64_t done, uint64_t total, void* arg) {
  progress_t* p = arg;
  int pct = total ? (int)(100 * done / total) : 100;
  if (pct == p->last) return;
  p->last = pct;
  int w = 30, k = pct * w / 100;
  fprintf(stderr, "\r  [%.*s%*s] %3d%% %s", k, "==============================", w - k, "", pct,
          p->what);
  fflush(stderr);
}

static void print_series(const replay_result_t* r, uint64_t events, uint64_t points) {
  if (!r->series_live || !points) return;
  uint64_t pts = events < points ? events : points;
  const char* names[4] = {"event", "live", "reserved", "driver_us"};
  int nk = r->series_driver_us ? 4 : 3;
  printf(", \"series\": {");
  for (int k = 0; k < nk; k++) {
    printf("%s\"%s\": [", k ? ", " : "", names[k]);
    for (uint64_t p = 0; p < pts; p++) {
      uint64_t a = p * events / pts, b = (p + 1) * events / pts, v = 0, at = b;
      for (uint64_t i = a; i < b; i++) { /* the bucket's largest reserved (or live) value */
        uint64_t x = k == 1 ? r->series_live[i] : r->series_reserved[i];
        if (x >= v) {
          v = x;
          at = i + 1;
        }
      }
      if (k == 3) /* the driver time so far at the event the bucket names */
        printf("%s%.1f", p ? ", " : "", r->series_driver_us[at - 1]);
      else
        printf("%s%llu", p ? ", " : "", (unsigned long long)(k == 0 ? at : v));
    }
    printf("]");
  }
  printf("}");
}

/* --explain's last lines for a replay: where each pool's reserved bytes were when reserved
 * first reached its peak. */
static void explain_peak(FILE* f, const replay_result_t* r) {
  char text[512];
  for (int small = 1; small >= 0; small--)
    if (replay_peak_text(r, small, text, sizeof text))
      fprintf(f, "at the peak (after event %llu), %s\n", (unsigned long long)r->layout_event,
              text);
}

/* Whether paths a and b name one existing file (the same inode): an output that would
 * overwrite an input, or the other output. */
static bool same_file(const char* a, const char* b) {
  struct stat x, y;
  return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* Whether an existing file begins as a trace does: gzip's magic, a pickle's protocol byte,
 * or RMM's CSV header. stash-replay writes none of these. */
static bool looks_like_a_trace(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return false;
  unsigned char b[8] = {0};
  size_t n = fread(b, 1, sizeof b, f);
  fclose(f);
  return (n >= 2 && b[0] == 0x1f && b[1] == 0x8b) || (n >= 2 && b[0] == 0x80 && b[1] >= 2) ||
         (n >= 7 && !memcmp(b, "Thread,", 7));
}

/* The files stash-replay writes besides stdout: --html, and --explain and --calls (which
 * may write to stderr, "-"). */
typedef struct output_s {
  const char* what; /* the option */
  const char* path; /* NULL: not asked for */
  bool may_stderr;  /* "-" means stderr */
} output_t;

/* Whether outs[k]'s path is one of the traces, or an earlier output's, or an existing trace
 * file, or looks like an option: refused before anything is written, so that a slip of the
 * argument order ("--explain TRACE", the file forgotten) loses no trace. */
static bool output_clashes(const output_t* outs, int k, const char* const* traces, int ntraces) {
  const char* what = outs[k].what;
  const char* path = outs[k].path;
  if (!path) return false;
  if (!strcmp(path, "-")) { /* stderr, for the text outputs; a page has no stream of its own */
    if (!outs[k].may_stderr) {
      fprintf(stderr, "stash-replay: %s needs a file to write, not '-' (stdout carries the "
                      "table or the JSON)\n", what);
      return true;
    }
    for (int j = 0; j < k; j++) {
      if (outs[j].path && !strcmp(outs[j].path, "-")) {
        fprintf(stderr, "stash-replay: %s and %s both write to stderr ('-'): give one of "
                        "them a file\n", outs[j].what, what);
        return true;
      }
    }
    return false;
  }
  if (path[0] == '-') {
    fprintf(stderr, "stash-replay: %s '%s' looks like an option, not a file to write "
                    "(%s FILE%s%s)\n", what, path, what, outs[k].may_stderr ? ", or " : "",
            outs[k].may_stderr ? "- for stderr" : "");
    return true;
  }
  for (int i = 0; i < ntraces; i++) {
    if (!strcmp(path, traces[i]) || same_file(path, traces[i])) {
      fprintf(stderr, "stash-replay: %s '%s' is also a trace to replay: it would be overwritten "
                      "(give the output file first: %s FILE TRACE...)\n", what, path, what);
      return true;
    }
  }
  for (int j = 0; j < k; j++) {
    const char* other = outs[j].path;
    if (other && (!strcmp(path, other) || same_file(path, other))) {
      fprintf(stderr, "stash-replay: %s and %s both write '%s'\n", outs[j].what, what, path);
      return true;
    }
  }
  if (looks_like_a_trace(path)) {
    fprintf(stderr, "stash-replay: %s '%s' is a trace file: it would be overwritten "
                    "(%s FILE TRACE...; remove the file first to reuse its name)\n", what, path,
            what);
    return true;
  }
  return false;
}

/* Open a text output ("-": stderr); NULL, with a message, if it cannot be written. */
static FILE* output_open(const output_t* o) {
  FILE* f = !strcmp(o->path, "-") ? stderr : fopen(o->path, "w");
  if (!f) fprintf(stderr, "stash-replay: %s: cannot write '%s'\n", o->what, o->path);
  return f;
}

/* Close a text output; false, with a message, if writing it failed. */
static bool output_close(const output_t* o, FILE* f) {
  if (!f || f == stderr) return true;
  if (fclose(f) == 0) return true;
  fprintf(stderr, "stash-replay: %s: error writing '%s'\n", o->what, o->path);
  return false;
}

int main(int argc, char** argv) {
  const char* confs[MAX_CONFS];
  int nconfs = 0;
  const char* traces[256];
  int ntraces = 0;
  replay_opts_t opts = {0};
  bool json = false;
  const char* html_path = NULL;
  const char* explain_path = NULL;
  const char* calls_path = NULL;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      json = true;
    } else if (!strcmp(a, "--trace-addresses")) {
      opts.trace_addresses = true;
    } else if (!strcmp(a, "--empty-cache-between-steps")) {
      opts.empty_cache_between_steps = true;
    } else if (!strcmp(a, "--driver-check")) {
      opts.driver_check = true;
    } else if (!strcmp(a, "--html") || !strcmp(a, "--series") || !strcmp(a, "--explain") ||
               !strcmp(a, "--calls")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "stash-replay: %s needs a value\n", a);
        return 2;
      }
      const char* v = argv[++i];
      if (!strcmp(a, "--html")) {
        html_path = v;
      } else if (!strcmp(a, "--explain")) {
        explain_path = v;
      } else if (!strcmp(a, "--calls")) {
        calls_path = v;
      } else if (!trace_parse_size(v, &g_series_points) || g_series_points == 0 ||
                 g_series_points > 10000000) {
        fprintf(stderr, "stash-replay: --series: '%s' is not a number of points (1..10000000)\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--conf") || !strcmp(a, "--capacity") || !strcmp(a, "--check") ||
               !strcmp(a, "--provider") || !strcmp(a, "--device") || !strcmp(a, "--lag")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "stash-replay: %s needs a value\n", a);
        return 2;
      }
      const char* v = argv[++i];
      if (!strcmp(a, "--conf")) {
        if (nconfs == MAX_CONFS) {
          fprintf(stderr, "stash-replay: more than %d --conf\n", MAX_CONFS);
          return 2;
        }
        confs[nconfs++] = v;
      } else if (!strcmp(a, "--capacity")) {
        if (!trace_parse_size(v, &opts.capacity) || opts.capacity == 0) {
          fprintf(stderr, "stash-replay: --capacity: '%s' is not a size (e.g. 80GiB)\n", v);
          return 2;
        }
      } else if (!strcmp(a, "--provider")) {
        if (strcmp(v, "cuda") && strcmp(v, "sim")) {
          fprintf(stderr, "stash-replay: --provider: '%s' is not a provider (sim, cuda)\n", v);
          return 2;
        }
        opts.cuda = !strcmp(v, "cuda");
      } else if (!strcmp(a, "--device")) {
        uint64_t d;
        if (!trace_parse_size(v, &d) || d > 1023) {
          fprintf(stderr, "stash-replay: --device: '%s' is not a device number\n", v);
          return 2;
        }
        opts.device = (int)d;
      } else if (!strcmp(a, "--lag")) {
        if (!trace_parse_size(v, &opts.lag) || opts.lag > 100000000) {
          fprintf(stderr, "stash-replay: --lag: '%s' is not a number of events (0..100000000)\n", v);
          return 2;
        }
      } else if (!trace_parse_size(v, &opts.check_every)) {
        fprintf(stderr, "stash-replay: --check: '%s' is not a number\n", v);
        return 2;
      }
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "stash-replay: unknown option '%s' (see --help)\n", a);
      return 2;
    } else {
      if (ntraces == 256) {
        fprintf(stderr, "stash-replay: more than 256 traces\n");
        return 2;
      }
      traces[ntraces++] = a;
    }
  }
  if (ntraces == 0) traces[ntraces++] = STASH_DATA_DIR "/traces/resnet50_train.csv.gz";
  if (nconfs == 0) {
    confs[nconfs++] = "policy:stash";
    confs[nconfs++] = "policy:pytorch";
    confs[nconfs++] = "policy:pytorch,max_split_size_mb:200";
    confs[nconfs++] = "policy:pytorch,roundup_power2_divisions:4";
    confs[nconfs++] = "policy:pytorch,expandable_segments:True";
  }
  if (opts.cuda) {
    const stash_provider_t* p;
    if (opts.capacity) {
      fprintf(stderr, "stash-replay: --capacity applies to the simulated device, not to a GPU\n");
      return 2;
    }
    if (opts.lag) {
      fprintf(stderr, "stash-replay: --lag applies to the simulated device; a GPU has its own\n");
      return 2;
    }
    if (opts.driver_check && opts.check_every) {
      fprintf(stderr, "stash-replay: --driver-check and --check do not mix (the check's own "
                      "memory would count)\n");
      return 2;
    }
    if (stash_cuda_provider(&p) != STASH_OK) {
      fprintf(stderr, "stash-replay: --provider cuda: %s\n", stash_last_error());
      return 2;
    }
  }
  /* Parse every configuration before replaying anything. */
  stash_conf_t parsed[MAX_CONFS];
  for (int c = 0; c < nconfs; c++) {
    stash_conf_init(&parsed[c]);
    if (stash_conf_parse(&parsed[c], confs[c]) != STASH_OK) {
      fprintf(stderr, "stash-replay: --conf '%s': %s\n", confs[c], stash_last_error());
      return 2;
    }
  }
  const output_t outs[] = {{"--explain", explain_path, true},
                           {"--html", html_path, false},
                           {"--calls", calls_path, true}};
  enum { OUT_EXPLAIN, OUT_HTML, OUT_CALLS, NOUTS };
  for (int k = 0; k < NOUTS; k++)
    if (output_clashes(outs, k, traces, ntraces)) return 2;
  FILE* html = NULL;
  if (html_path) {
    html = fopen(html_path, "w");
    if (!html) {
      fprintf(stderr, "stash-replay: --html: cannot write '%s'\n", html_path);
      return 2;
    }
    html_begin(html);
    opts.series = opts.layout = true;
  }
  if (g_series_points) opts.series = true;
  if (explain_path && !(opts.explain = output_open(&outs[OUT_EXPLAIN]))) return 2;
  if (calls_path && !(opts.calls = output_open(&outs[OUT_CALLS]))) return 2;
  progress_t bar = {NULL, -1};
  bool tty = isatty(2);
  int rc = 0;
  for (int ti = 0; ti < ntraces; ti++) {
    trace_t t;
    char err[512];
    if (!trace_read(traces[ti], &t, err, sizeof err, warn_cb, NULL)) {
      fprintf(stderr, "stash-replay: %s\n", err);
      rc = 1;
      continue;
    }
    replay_result_t results[MAX_CONFS];
    bool ok[MAX_CONFS];
    for (int c = 0; c < nconfs; c++) {
      bar.what = confs[c];
      bar.last = -1;
      opts.progress = tty && t.nevents >= 200000 ? progress_cb : NULL;
      opts.progress_arg = &bar;
      if (opts.explain) fprintf(opts.explain, "# %s under %s\n", t.name, confs[c]);
      if (opts.calls) fprintf(opts.calls, "# %s under %s\n", t.name, confs[c]);
      stash_status_t st = replay_run(&t, &parsed[c], &opts, &results[c]);
      if (opts.progress) fprintf(stderr, "\r%*s\r", 80, "");
      ok[c] = st == STASH_OK;
      if (!ok[c]) {
        fprintf(stderr, "stash-replay: %s under '%s': %s: %s\n", t.name, confs[c],
                stash_status_name(st), stash_last_error());
        rc = 1;
        continue;
      }
      if (opts.explain) explain_peak(opts.explain, &results[c]);
      if (json) print_json(&t, confs[c], opts.cuda ? "cuda" : "sim", &results[c]);
    }
    int best = -1;
    for (int c = 0; c < nconfs; c++) {
      if (ok[c] && !results[c].ooms &&
          (best < 0 || results[c].peak_reserved_bytes < results[best].peak_reserved_bytes))
        best = c;
    }
    if (!json) {
      print_table_header(&t, opts.lag); /* (0 with a GPU: --lag is refused there) */
      for (int c = 0; c < nconfs; c++) {
        if (ok[c]) print_table_row(confs[c], &results[c], c == best, !opts.cuda);
      }
      for (int c = 0; c < nconfs; c++) {
        if (ok[c]) print_capacity(confs[c], &results[c], opts.capacity);
      }
      printf("  (* least reserved; util = peak live / peak reserved; wasted = peak reserved - "
             "peak live, GiB; dev+/dev- = device allocations/frees; driver ms = the provider "
             "calls' cost %s; late = provider calls in the second half)\n",
             opts.cuda ? "measured on this GPU (wall time)" : "modelled on an H200");
    }
    if (html) html_trace(html, &t, confs, results, ok, nconfs, best);
    for (int c = 0; c < nconfs; c++) replay_result_free(&results[c]);
    trace_free(&t);
  }
  if (!output_close(&outs[OUT_EXPLAIN], opts.explain)) rc = 1;
  if (!output_close(&outs[OUT_CALLS], opts.calls)) rc = 1;
  if (html) {
    html_end(html);
    if (fclose(html) != 0) {
      fprintf(stderr, "stash-replay: --html: error writing '%s'\n", html_path);
      rc = 1;
    } else if (!json) {
      printf("\nwrote %s\n", html_path);
    }
  }
  return rc;
}
