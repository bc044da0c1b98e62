/* zombies.c: memory the driver refused to take back (an unmap or a release that failed),
 * remembered by a policy and retried later, so that a driver error loses nothing for good.
 * Called under the heap's lock. */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

void _stash_zombies_add(stash_zombies_t* z, uint64_t va, size_t size, uint64_t handle) {
  stash_zombie_t* v = _stash_array_grow(z->v, &z->cap, z->n + 1, sizeof *v, 8);
  if (!v) {
    /* cannot even remember it: the memory stays with the driver until the process ends */
    fprintf(stderr, "stash: out of host memory: %zu bytes of device memory are lost\n", size);
    return;
  }
  z->v = v;
  z->v[z->n++] = (stash_zombie_t){va, size, handle};
}

stash_status_t _stash_zombies_release(stash_heap_t* h, stash_zombies_t* z) {
  stash_status_t first = STASH_OK;
  size_t k = 0;
  for (size_t i = 0; i < z->n; i++) {
    stash_zombie_t* x = &z->v[i];
    stash_status_t st = STASH_OK;
    if (x->va) {
      st = _STASH_PCALL(h, unmap, h->device, x->va, x->size);
      if (st == STASH_OK) x->va = 0;
      else if (first == STASH_OK) first = _stash_prov_fail(h, st, "unmap memory");
    }
    if (st == STASH_OK && x->handle) {
      st = _STASH_PCALL(h, phys_release, h->device, x->handle);
      if (st == STASH_OK) x->handle = 0;
      else if (first == STASH_OK) first = _stash_prov_fail(h, st, "release physical memory");
    }
    if (st != STASH_OK) z->v[k++] = *x;
  }
  z->n = k;
  return first;
}

bool _stash_zombies_within(const stash_zombies_t* z, uint64_t base, size_t size) {
  for (size_t i = 0; i < z->n; i++) {
    if (z->v[i].va >= base && z->v[i].va < base + size) return true;
  }
  return false;
}

void _stash_zombies_free(stash_zombies_t* z) {
  free(z->v);
  z->v = NULL;
  z->n = z->cap = 0;
}
