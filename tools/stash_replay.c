/* stash-replay: replay allocation traces through stash on a simulated device and report
 * what each configuration reserves.
 *
 *   stash-replay [--conf STR]... [--capacity SIZE] [--json] [--check N]
 *                [--provider sim|cuda] [--device N] [--driver-check] [TRACE...]
 *
 * With no trace, it replays the ResNet-50 trace shipped with stash under policy:stash and
 * PyTorch's default and expandable-segments settings.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"
#include "stash.h"
#include "stash_provider.h"
#include "trace.h"

#ifndef STASH_DATA_DIR
#define STASH_DATA_DIR "data"
#endif

#define MAX_CONFS 64

static void usage(FILE* f) {
  fprintf(f,
          "usage: stash-replay [options] [TRACE.csv[.gz]...]\n"
          "\n"
          "Replays allocation traces (RMM's CSV log, plain or gzip) through stash on a\n"
          "simulated device and reports, per configuration, the peak memory reserved.\n"
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
          "  --provider P     sim (default): the simulated device; cuda: a real GPU\n"
          "  --device N       the GPU to replay on, with --provider cuda (default 0)\n"
          "  --driver-check   with cuda: read the driver's memory in use (cuMemGetInfo)\n"
          "                   whenever reserved bytes change and report how far apart they are\n"
          "  -h, --help       this text\n"
          "\n"
          "With no trace: %s/traces/resnet50_train.csv.gz under policy:stash,\n"
          "policy:pytorch and policy:pytorch,expandable_segments:True.\n",
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
         "\"ns_per_event\": %.1f, \"modeled_driver_us\": %.1f, "
         "\"device_allocs_second_half\": %llu, \"device_frees_second_half\": %llu",
         (unsigned long long)r->events, t->nstreams, (unsigned long long)r->peak_live_bytes,
         (unsigned long long)r->peak_reserved_bytes, (unsigned long long)r->peak_allocated_bytes,
         (unsigned long long)r->peak_active_bytes,
         r->peak_reserved_bytes ? (double)r->peak_live_bytes / (double)r->peak_reserved_bytes : 0.0,
         (unsigned long long)r->device_allocs, (unsigned long long)r->device_frees,
         (unsigned long long)r->alloc_retries, (unsigned long long)r->ooms, r->ns_per_event,
         r->modeled_driver_us, (unsigned long long)r->device_allocs_second_half,
         (unsigned long long)r->device_frees_second_half);
  if (!strcmp(provider, "sim")) {
    /* every kind of call made: how many, and their modelled cost */
    printf(", \"calls\": {");
    int first = 1;
    for (int k = 0; k < STASH_CALL_COUNT; k++) {
      if (!r->calls[k]) continue;
      printf("%s\"%s\": [%llu, %.1f]", first ? "" : ", ",
             stash_provider_call_name((stash_provider_call_t)k), (unsigned long long)r->calls[k],
             r->driver_us[k]);
      first = 0;
    }
    printf("}");
  }
  if (r->driver_checked)
    printf(", \"driver_checks\": %llu, \"driver_used_at_peak_bytes\": %llu, "
           "\"driver_gap_max_bytes\": %lld",
           (unsigned long long)r->driver_checks, (unsigned long long)r->driver_used_at_peak,
           (long long)r->driver_gap_max);
  printf("}\n");
  fflush(stdout);
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static void print_table_header(const trace_t* t) {
  printf("\n%s: %zu events, %zu stream%s, peak live %llu bytes (%.2f GiB)\n", t->name,
         t->nevents, t->nstreams, t->nstreams == 1 ? "" : "s",
         (unsigned long long)t->peak_live, gib(t->peak_live));
  printf("  %-44s %15s %9s %6s %15s %7s %7s %5s %9s\n", "configuration", "peak reserved", "GiB",
         "util", "peak allocated", "dev+", "dev-", "OOMs", "ns/event");
}

static void print_table_row(const char* conf, const replay_result_t* r, bool best) {
  double util = r->peak_reserved_bytes ? 100.0 * (double)r->peak_live_bytes /
                                             (double)r->peak_reserved_bytes
                                       : 0.0;
  printf("%c %-44s %15llu %9.2f %5.1f%% %15llu %7llu %7llu %5llu %9.0f\n", best ? '*' : ' ',
         conf, (unsigned long long)r->peak_reserved_bytes, gib(r->peak_reserved_bytes), util,
         (unsigned long long)r->peak_allocated_bytes, (unsigned long long)r->device_allocs,
         (unsigned long long)r->device_frees, (unsigned long long)r->ooms, r->ns_per_event);
}

int main(int argc, char** argv) {
  const char* confs[MAX_CONFS];
  int nconfs = 0;
  const char* traces[256];
  int ntraces = 0;
  replay_opts_t opts = {0};
  bool json = false;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      json = true;
    } else if (!strcmp(a, "--driver-check")) {
      opts.driver_check = true;
    } else if (!strcmp(a, "--conf") || !strcmp(a, "--capacity") || !strcmp(a, "--check") ||
               !strcmp(a, "--provider") || !strcmp(a, "--device")) {
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
    confs[nconfs++] = "policy:pytorch,expandable_segments:True";
  }
  if (opts.cuda) {
    const stash_provider_t* p;
    if (opts.capacity) {
      fprintf(stderr, "stash-replay: --capacity applies to the simulated device, not to a GPU\n");
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
      stash_status_t st = replay_run(&t, &parsed[c], &opts, &results[c]);
      ok[c] = st == STASH_OK;
      if (!ok[c]) {
        fprintf(stderr, "stash-replay: %s under '%s': %s: %s\n", t.name, confs[c],
                stash_status_name(st), stash_last_error());
        rc = 1;
        continue;
      }
      if (json) print_json(&t, confs[c], opts.cuda ? "cuda" : "sim", &results[c]);
    }
    if (!json) {
      int best = -1;
      for (int c = 0; c < nconfs; c++) {
        if (ok[c] && !results[c].ooms &&
            (best < 0 || results[c].peak_reserved_bytes < results[best].peak_reserved_bytes))
          best = c;
      }
      print_table_header(&t);
      for (int c = 0; c < nconfs; c++) {
        if (ok[c]) print_table_row(confs[c], &results[c], c == best);
      }
      for (int c = 0; c < nconfs; c++) {
        if (ok[c] && results[c].ooms)
          printf("  %s: %llu allocations ran out of memory, the first at line %llu\n", confs[c],
                 (unsigned long long)results[c].ooms,
                 (unsigned long long)results[c].first_oom_line);
      }
      printf("  (* least reserved; util = peak live / peak reserved; dev+/dev- = device "
             "allocations/frees)\n");
    }
    trace_free(&t);
  }
  return rc;
}
