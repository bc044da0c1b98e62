/* timed_provider.h: a provider that forwards every call to another one and measures it - the
 * host's wall time of each call that succeeds, told to a hook as the simulated device tells
 * its modelled cost (stash_sim_on_call) - so that stash-replay --provider cuda says what the
 * driver calls took on the GPU (measured_driver_us, --calls), beside what the simulated
 * device models for the same replay. */
#ifndef STASH_TIMED_PROVIDER_H
#define STASH_TIMED_PROVIDER_H

#include "stash_provider.h"

typedef struct timed_provider_s {
  stash_provider_t table;          /* what the heap is given; its ctx is this struct */
  const stash_provider_t* inner;   /* where the calls go */
  stash_sim_call_fn hook;          /* told of each call that succeeded (NULL: none) */
  void* hook_arg;
  double total_us;                 /* the calls' wall time so far, us */
  uint64_t calls[STASH_CALL_COUNT]; /* calls that succeeded, by kind */
  double us[STASH_CALL_COUNT];     /* their wall time, by kind */
} timed_provider_t;

/* Wrap inner: t->table forwards each of inner's functions (one inner lacks stays NULL). */
void timed_provider_init(timed_provider_t* t, const stash_provider_t* inner,
                         stash_sim_call_fn hook, void* hook_arg);

#endif
