/* probe_time.h: the clock and the median of the driver probes (access_probe.c, size_probe.c),
 * each a single-file program built on the device with cc. */
#ifndef STASH_PROBE_TIME_H
#define STASH_PROBE_TIME_H
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* The median of v[0..n) (n odd: the middle one), sorting v. */
static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmpd);
  return v[n / 2];
}
#endif
