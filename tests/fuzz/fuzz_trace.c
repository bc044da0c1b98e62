/* fuzz_trace: the trace readers (RMM CSV and PyTorch snapshot, plain or gzip) on arbitrary
 * bytes, then a short replay of whatever was read. Built two ways: with libFuzzer (clang
 * -fsanitize=fuzzer, tests/fuzz/run.sh) to search, and with corpus_main.c to replay the
 * committed corpus in CTest. Whatever the input: no crash, no leak, no undefined behaviour;
 * a rejected input has a message. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "replay.h"
#include "snapshot.h"
#include "trace.h"

static bool count_event(void* arg, int kind, uint64_t addr, uint64_t size, uint64_t stream,
                        uint64_t index) {
  (void)kind, (void)addr, (void)size, (void)stream, (void)index;
  ++*(size_t*)arg;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  /* the pickle machine alone, on the raw bytes */
  size_t n = 0;
  snapshot_info_t info;
  char err[512];
  if (!snapshot_read(data, size, -1, count_event, &n, &info, err, sizeof err) && !err[0]) abort();
  /* the whole reader, through a file descriptor */
  int fd = memfd_create("fuzz", 0);
  if (fd < 0) return 0;
  if (size && write(fd, data, size) != (ssize_t)size) {
    close(fd);
    return 0;
  }
  lseek(fd, 0, SEEK_SET);
  trace_t t;
  err[0] = '\0';
  if (!trace_read_fd(fd, "input", &t, err, sizeof err, NULL, NULL)) {
    if (!err[0]) abort(); /* a rejection must say why */
    return 0;
  }
  if (t.nevents && t.nevents < 2000) { /* and replay it, on a small device, under policy:stash
                                          * and PyTorch's expandable segments (the other policy
                                          * that maps pages), and under policy:stash with
                                          * empty_cache between steps (the paths that give
                                          * memory back while blocks live), and under
                                          * policy:stash on a GPU that lags by 1-32 events
                                          * (the cross-stream check: --check with a lag) */
    static const struct {
      const char* conf;
      bool empty_cache, lag;
    } runs[] = {{"policy:stash", false, false},
                {"policy:pytorch,expandable_segments:True", false, false},
                {"policy:stash", true, false},
                {"policy:stash", false, true}};
    for (size_t c = 0; c < sizeof runs / sizeof runs[0]; c++) {
      stash_conf_t conf;
      stash_conf_init(&conf);
      if (stash_conf_parse(&conf, runs[c].conf) != STASH_OK) abort();
      replay_opts_t opts = {.capacity = 1ull << 30,
                            .check_every = 1,
                            .empty_cache_between_steps = runs[c].empty_cache,
                            .lag = runs[c].lag ? 1 + data[size - 1] % 32 : 0};
      replay_result_t r;
      stash_status_t st = replay_run(&t, &conf, &opts, &r);
      if (st != STASH_OK) abort(); /* any trace must replay, its OOMs counted */
      replay_result_free(&r);
    }
  }
  trace_free(&t);
  return 0;
}
