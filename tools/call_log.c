/* call_log.c: stash-replay --calls (call_log.h). */
#include "call_log.h"

#include <string.h>

#define MIB(x) ((double)(x) / 1048576.0)

void call_log_begin(call_log_t* L, FILE* f, uint64_t nevents, bool measured) {
  memset(L, 0, sizeof *L);
  L->f = f;
  L->nevents = nevents;
  L->measured = measured;
}

void call_log_hook(void* arg, stash_provider_call_t call, uint64_t bytes, double us) {
  call_log_t* L = arg;
  if ((int)call < 0 || call >= STASH_CALL_COUNT) return;
  L->n[call]++;
  L->bytes[call] += bytes;
  L->us[call] += us;
}

/* Keep the CALL_LOG_TOP costliest events, costliest first (the earlier one on a tie). */
static void top_add(call_log_t* L, uint64_t event, uint64_t line, double us) {
  int i = L->ntop;
  if (i == CALL_LOG_TOP) {
    if (L->top[i - 1].us >= us) return; /* not among them */
    i--;                                /* the last of them goes */
  } else {
    L->ntop++;
  }
  for (; i > 0 && L->top[i - 1].us < us; i--) L->top[i] = L->top[i - 1];
  L->top[i].event = event;
  L->top[i].line = line;
  L->top[i].us = us;
}

void call_log_event(call_log_t* L, uint64_t event, uint64_t line, bool alloc, uint64_t size) {
  double sum = 0;
  bool any = false;
  for (int k = 0; k < STASH_CALL_COUNT; k++) {
    sum += L->us[k];
    any |= L->n[k] != 0;
  }
  if (!any) return;
  if (event)
    fprintf(L->f, "event %llu (line %llu, %s %.1f MiB):", (unsigned long long)event,
            (unsigned long long)line, alloc ? "alloc" : "free", MIB(size));
  else
    fprintf(L->f, "creating the heap:");
  const char* sep = " ";
  for (int k = 0; k < STASH_CALL_COUNT; k++) {
    if (!L->n[k]) continue;
    fprintf(L->f, "%s%s %llu", sep, stash_provider_call_name((stash_provider_call_t)k),
            (unsigned long long)L->n[k]);
    if (L->bytes[k]) fprintf(L->f, " (%.1f MiB)", MIB(L->bytes[k]));
    fprintf(L->f, " %.1f us", L->us[k]);
    sep = ", ";
    L->total_n[k] += L->n[k];
    L->total_us[k] += L->us[k];
  }
  L->total += sum;
  fprintf(L->f, "; %.1f us, %.1f so far\n", sum, L->total);
  uint64_t i = event ? event - 1 : 0;
  L->tenth[L->nevents ? i * 10 / L->nevents : 0] += sum;
  if (event) top_add(L, event, line, sum);
  memset(L->n, 0, sizeof L->n);
  memset(L->bytes, 0, sizeof L->bytes);
  memset(L->us, 0, sizeof L->us);
}

void call_log_end(call_log_t* L) {
  uint64_t calls = 0;
  for (int k = 0; k < STASH_CALL_COUNT; k++) calls += L->total_n[k];
  fprintf(L->f, "total (%s): %.1f us in %llu calls\n",
          L->measured ? "measured wall time" : "modelled on an H200", L->total,
          (unsigned long long)calls);
  if (!calls) return;
  fprintf(L->f, "by kind:");
  bool done[STASH_CALL_COUNT] = {false};
  const char* sep = " ";
  for (;;) { /* costliest first */
    int best = -1;
    for (int k = 0; k < STASH_CALL_COUNT; k++)
      if (!done[k] && L->total_n[k] && (best < 0 || L->total_us[k] > L->total_us[best])) best = k;
    if (best < 0) break;
    done[best] = true;
    fprintf(L->f, "%s%s %llu call%s %.1f us (%.1f%%)", sep,
            stash_provider_call_name((stash_provider_call_t)best),
            (unsigned long long)L->total_n[best], L->total_n[best] == 1 ? "" : "s", L->total_us[best],
            L->total > 0 ? 100.0 * L->total_us[best] / L->total : 0.0);
    sep = ", ";
  }
  fprintf(L->f, "\nby tenth of the trace's events, us:");
  for (int i = 0; i < 10; i++) fprintf(L->f, " %.1f", L->tenth[i]);
  fprintf(L->f, "\ncostliest events:");
  for (int i = 0; i < L->ntop; i++)
    fprintf(L->f, "%s event %llu (line %llu) %.1f us", i ? "," : "",
            (unsigned long long)L->top[i].event, (unsigned long long)L->top[i].line,
            L->top[i].us);
  fprintf(L->f, "\n");
}
