/* ptrmap.c: device address -> object, an open-addressing hash table.
 *
 * Linear probing over a power-of-two table kept at most half full; deletion shifts later
 * entries back (no tombstones), so lookups stay short however long the heap lives.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PTRMAP_MIN_CAP 256

/* Fibonacci hashing: the top log2(cap) bits of the key times 2^64 / phi, which every bit of
 * the key moves. (The bits just above the 17th, as before the thirty-seventh session, move
 * with the key's low bits only: addresses 2 MiB apart or more and equal in their low 25 bits
 * - large blocks in one arena, pages - shared a handful of slots, and a lookup walked long
 * runs: ~5% of a replay's instructions went to _stash_ptrmap_get.) */
static inline size_t slot_of(uint64_t key, unsigned shift) {
  return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> shift);
}

static unsigned shift_of(size_t cap) {
  unsigned bits = 0;
  while (((size_t)1 << bits) < cap) bits++;
  return 64 - bits;
}

void _stash_ptrmap_init(ptrmap_t* m) { memset(m, 0, sizeof *m); }

void _stash_ptrmap_free(ptrmap_t* m) {
  free(m->keys);
  free(m->values);
  memset(m, 0, sizeof *m);
}

static void insert_slot(uint64_t* keys, void** values, size_t cap, unsigned shift, uint64_t key,
                        void* value) {
  size_t i = slot_of(key, shift);
  while (keys[i] != 0 && keys[i] != key) i = (i + 1) & (cap - 1);
  keys[i] = key;
  values[i] = value;
}

static stash_status_t grow_to(ptrmap_t* m, size_t cap) {
  uint64_t* keys = calloc(cap, sizeof *keys);
  void** values = calloc(cap, sizeof *values);
  if (!keys || !values) {
    free(keys);
    free(values);
    return STASH_ERR_HOST_OOM;
  }
  unsigned shift = shift_of(cap);
  for (size_t i = 0; i < m->cap; i++) {
    if (m->keys[i]) insert_slot(keys, values, cap, shift, m->keys[i], m->values[i]);
  }
  free(m->keys);
  free(m->values);
  m->keys = keys;
  m->values = values;
  m->cap = cap;
  m->shift = shift;
  return STASH_OK;
}

stash_status_t _stash_ptrmap_reserve(ptrmap_t* m, size_t extra) {
  size_t need = m->count + extra;
  if (need * 2 <= m->cap) return STASH_OK;
  size_t cap = m->cap ? m->cap : PTRMAP_MIN_CAP;
  while (need * 2 > cap) cap *= 2;
  return grow_to(m, cap);
}

stash_status_t _stash_ptrmap_put(ptrmap_t* m, uint64_t key, void* value) {
  stash_status_t st = _stash_ptrmap_reserve(m, 1);
  if (st != STASH_OK) return st;
  size_t i = slot_of(key, m->shift);
  while (m->keys[i] != 0 && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
  if (m->keys[i] == 0) m->count++;
  m->keys[i] = key;
  m->values[i] = value;
  return STASH_OK;
}

void* _stash_ptrmap_get(const ptrmap_t* m, uint64_t key) {
  if (!m->cap || key == 0) return NULL;
  size_t i = slot_of(key, m->shift);
  while (m->keys[i] != 0) {
    if (m->keys[i] == key) return m->values[i];
    i = (i + 1) & (m->cap - 1);
  }
  return NULL;
}

void* _stash_ptrmap_take(ptrmap_t* m, uint64_t key) {
  if (!m->cap || key == 0) return NULL;
  size_t mask = m->cap - 1;
  size_t i = slot_of(key, m->shift);
  while (m->keys[i] != key) {
    if (m->keys[i] == 0) return NULL;
    i = (i + 1) & mask;
  }
  void* value = m->values[i];
  /* Backward-shift deletion: move back every later entry of the run that may sit there. */
  size_t hole = i;
  size_t j = (i + 1) & mask;
  while (m->keys[j] != 0) {
    size_t home = slot_of(m->keys[j], m->shift);
    /* Entry j can fill the hole if its home is not cyclically in (hole, j]. */
    bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!in_range) {
      m->keys[hole] = m->keys[j];
      m->values[hole] = m->values[j];
      hole = j;
    }
    j = (j + 1) & mask;
  }
  m->keys[hole] = 0;
  m->values[hole] = NULL;
  m->count--;
  return value;
}
