/* slab.c: fixed-size objects (block metadata) carved from 64 KiB chunks.
 *
 * One malloc per chunk rather than per block; freed objects go on a free list and are
 * reused first. Chunks are returned to the system only when the slab is destroyed.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SLAB_CHUNK_BYTES (64 * 1024)

void* _stash_array_grow(void* v, size_t* cap, size_t need, size_t size, size_t least) {
  if (need <= *cap) return v;
  size_t c = *cap ? *cap : least;
  while (c < need) c *= 2;
  void* nv = realloc(v, c * size);
  if (nv) *cap = c;
  return nv;
}

void _stash_slab_init(slab_t* s, size_t obj_size) {
  memset(s, 0, sizeof *s);
  if (obj_size < sizeof(void*)) obj_size = sizeof(void*);
  obj_size = (obj_size + 15) & ~(size_t)15;
  s->obj_size = obj_size;
  s->per_chunk = (SLAB_CHUNK_BYTES - 16) / obj_size;
  if (s->per_chunk == 0) s->per_chunk = 1;
}

void* _stash_slab_alloc(slab_t* s) {
  void* obj = _stash_slab_take(s);
  if (obj) memset(obj, 0, s->obj_size);
  return obj;
}

void* _stash_slab_take(slab_t* s) {
  if (!s->free_list) {
    /* The first 16 bytes of a chunk link the chunks; objects follow. */
    char* chunk = malloc(16 + s->per_chunk * s->obj_size);
    if (!chunk) return NULL;
    *(void**)chunk = s->chunks;
    s->chunks = chunk;
    for (size_t i = s->per_chunk; i-- > 0;) {
      void* obj = chunk + 16 + i * s->obj_size;
      *(void**)obj = s->free_list;
      s->free_list = obj;
    }
  }
  void* obj = s->free_list;
  s->free_list = *(void**)obj;
  s->live++;
  return obj;
}

void _stash_slab_free(slab_t* s, void* obj) {
  *(void**)obj = s->free_list;
  s->free_list = obj;
  s->live--;
}

void _stash_slab_destroy(slab_t* s) {
  void* c = s->chunks;
  while (c) {
    void* next = *(void**)c;
    free(c);
    c = next;
  }
  s->chunks = NULL;
  s->free_list = NULL;
  s->live = 0;
}
