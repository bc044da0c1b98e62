/* timed_provider.c: a provider that measures the calls it forwards (timed_provider.h). */
#include "timed_provider.h"

#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static stash_status_t done(timed_provider_t* t, stash_provider_call_t call, uint64_t bytes,
                           double t0, stash_status_t st) {
  if (st != STASH_OK) return st; /* as the simulated device: failed calls are not counted */
  double us = now_us() - t0;
  t->total_us += us;
  t->calls[call]++;
  t->us[call] += us;
  if (t->hook) t->hook(t->hook_arg, call, bytes, us);
  return st;
}

/* One forwarding function per provider function: time the inner call. */
#define TIMED(call, bytes, expr)                           \
  timed_provider_t* t = ctx;                              \
  double t0 = now_us();                                   \
  stash_status_t st = (expr);                             \
  return done(t, STASH_CALL_##call, (uint64_t)(bytes), t0, st)

static stash_status_t t_device_count(void* ctx, int* count) {
  const timed_provider_t* t = ctx;
  return t->inner->device_count(t->inner->ctx, count);
}
static stash_status_t t_granularity(void* ctx, int device, size_t* bytes) {
  const timed_provider_t* t = ctx;
  return t->inner->granularity(t->inner->ctx, device, bytes);
}
static stash_status_t t_mem_info(void* ctx, int device, size_t* free_bytes, size_t* total) {
  TIMED(mem_info, 0, t->inner->mem_info(t->inner->ctx, device, free_bytes, total));
}
static stash_status_t t_mem_alloc(void* ctx, int device, size_t size, uint64_t* ptr) {
  TIMED(mem_alloc, size, t->inner->mem_alloc(t->inner->ctx, device, size, ptr));
}
static stash_status_t t_mem_free(void* ctx, int device, uint64_t ptr, size_t size) {
  TIMED(mem_free, size, t->inner->mem_free(t->inner->ctx, device, ptr, size));
}
static stash_status_t t_va_reserve(void* ctx, int device, size_t size, uint64_t* va) {
  TIMED(va_reserve, size, t->inner->va_reserve(t->inner->ctx, device, size, va));
}
static stash_status_t t_va_free(void* ctx, int device, uint64_t va, size_t size) {
  TIMED(va_free, size, t->inner->va_free(t->inner->ctx, device, va, size));
}
static stash_status_t t_phys_create(void* ctx, int device, size_t size, uint64_t* handle) {
  TIMED(phys_create, size, t->inner->phys_create(t->inner->ctx, device, size, handle));
}
static stash_status_t t_phys_release(void* ctx, int device, uint64_t handle) {
  TIMED(phys_release, 0, t->inner->phys_release(t->inner->ctx, device, handle));
}
static stash_status_t t_map(void* ctx, int device, uint64_t va, size_t size, uint64_t handle,
                            size_t offset) {
  TIMED(map, size, t->inner->map(t->inner->ctx, device, va, size, handle, offset));
}
static stash_status_t t_unmap(void* ctx, int device, uint64_t va, size_t size) {
  TIMED(unmap, size, t->inner->unmap(t->inner->ctx, device, va, size));
}
static stash_status_t t_set_access(void* ctx, int device, uint64_t va, size_t size) {
  TIMED(set_access, size, t->inner->set_access(t->inner->ctx, device, va, size));
}
static stash_status_t t_event_create(void* ctx, int device, uint64_t* event) {
  TIMED(event_create, 0, t->inner->event_create(t->inner->ctx, device, event));
}
static stash_status_t t_event_record(void* ctx, int device, uint64_t event, void* stream) {
  TIMED(event_record, 0, t->inner->event_record(t->inner->ctx, device, event, stream));
}
static stash_status_t t_event_query(void* ctx, uint64_t event) {
  /* STASH_ERR_NOT_READY is an answer, not a failure: counted too */
  timed_provider_t* t = ctx;
  double t0 = now_us();
  stash_status_t st = t->inner->event_query(t->inner->ctx, event);
  done(t, STASH_CALL_event_query, 0, t0, st == STASH_ERR_NOT_READY ? STASH_OK : st);
  return st;
}
static stash_status_t t_event_synchronize(void* ctx, uint64_t event) {
  TIMED(event_synchronize, 0, t->inner->event_synchronize(t->inner->ctx, event));
}
static stash_status_t t_event_destroy(void* ctx, uint64_t event) {
  TIMED(event_destroy, 0, t->inner->event_destroy(t->inner->ctx, event));
}
static stash_status_t t_stream_synchronize(void* ctx, int device, void* stream) {
  TIMED(stream_synchronize, 0, t->inner->stream_synchronize(t->inner->ctx, device, stream));
}
static stash_status_t t_stream_wait(void* ctx, int device, void* stream, uint64_t event) {
  TIMED(stream_wait, 0, t->inner->stream_wait(t->inner->ctx, device, stream, event));
}

void timed_provider_init(timed_provider_t* t, const stash_provider_t* inner,
                         stash_sim_call_fn hook, void* hook_arg) {
  memset(t, 0, sizeof *t);
  t->inner = inner;
  t->hook = hook;
  t->hook_arg = hook_arg;
  stash_provider_t* p = &t->table;
  p->version = STASH_PROVIDER_VERSION;
  p->size = sizeof *p;
  p->name = inner->name;
  p->ctx = t;
#define FORWARD(fn) p->fn = inner->fn ? t_##fn : NULL
  FORWARD(device_count);
  FORWARD(granularity);
  FORWARD(mem_info);
  FORWARD(mem_alloc);
  FORWARD(mem_free);
  FORWARD(va_reserve);
  FORWARD(va_free);
  FORWARD(phys_create);
  FORWARD(phys_release);
  FORWARD(map);
  FORWARD(unmap);
  FORWARD(set_access);
  FORWARD(event_create);
  FORWARD(event_record);
  FORWARD(event_query);
  FORWARD(event_synchronize);
  FORWARD(event_destroy);
  FORWARD(stream_synchronize);
  FORWARD(stream_wait);
#undef FORWARD
}
