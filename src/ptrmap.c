/* ptrmap.c: device address -> object, an open-addressing hash table.
 *
 * Linear probing over a power-of-two table kept at most half full; deletion shifts later
 * entries back (no tombstones), so lookups stay short however long the heap lives. A key and
 * its object lie side by side (one cache line for a lookup, not one in each of two arrays).
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
  free(m->slots);
  memset(m, 0, sizeof *m);
}

static void insert_slot(ptrmap_slot_t* slots, size_t cap, unsigned shift, uint64_t key,
                        void* value) {
  size_t i = slot_of(key, shift);
  while (slots[i].key != 0 && slots[i].key != key) i = (i + 1) & (cap - 1);
  slots[i] = (ptrmap_slot_t){key, value};
}

static stash_status_t grow_to(ptrmap_t* m, size_t cap) {
  ptrmap_slot_t* slots = calloc(cap, sizeof *slots);
  if (!slots) return STASH_ERR_HOST_OOM;
  unsigned shift = shift_of(cap);
  for (size_t i = 0; i < m->cap; i++) {
    if (m->slots[i].key) insert_slot(slots, cap, shift, m->slots[i].key, m->slots[i].value);
  }
  free(m->slots);
  m->slots = slots;
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
  stash_status_t st = _stash_ptrmap_room(m, 1);
  if (st != STASH_OK) return st;
  size_t i = slot_of(key, m->shift);
  while (m->slots[i].key != 0 && m->slots[i].key != key) i = (i + 1) & (m->cap - 1);
  if (m->slots[i].key == 0) m->count++;
  m->slots[i] = (ptrmap_slot_t){key, value};
  return STASH_OK;
}

void* _stash_ptrmap_get(const ptrmap_t* m, uint64_t key) {
  if (!m->cap || key == 0) return NULL;
  size_t i = slot_of(key, m->shift);
  while (m->slots[i].key != 0) {
    if (m->slots[i].key == key) return m->slots[i].value;
    i = (i + 1) & (m->cap - 1);
  }
  return NULL;
}

void* _stash_ptrmap_take(ptrmap_t* m, uint64_t key) {
  if (!m->cap || key == 0) return NULL;
  size_t mask = m->cap - 1;
  size_t i = slot_of(key, m->shift);
  while (m->slots[i].key != key) {
    if (m->slots[i].key == 0) return NULL;
    i = (i + 1) & mask;
  }
  void* value = m->slots[i].value;
  /* Backward-shift deletion: move back every later entry of the run that may sit there. */
  size_t hole = i;
  size_t j = (i + 1) & mask;
  while (m->slots[j].key != 0) {
    size_t home = slot_of(m->slots[j].key, m->shift);
    /* Entry j can fill the hole if its home is not cyclically in (hole, j]. */
    bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!in_range) {
      m->slots[hole] = m->slots[j];
      hole = j;
    }
    j = (j + 1) & mask;
  }
  m->slots[hole] = (ptrmap_slot_t){0, NULL};
  m->count--;
  return value;
}
