/* policy_stash_arena.c: policy:stash's arenas and their memory - reserving an arena's
 * virtual range, growing it at its end with new physical memory (arena_grow: the growth,
 * burst and piece rules of policy_stash.c's header), giving memory back (empty_cache: the
 * free end, arena_shrink; wholly free allocations between live blocks, arena_give_back),
 * taking given-back memory back in place (arena_take_back, take_back_range), trying dead
 * memory again (arena_revive), and mapping at their arena address the allocations made for
 * a stitched range when a block first lands on them (arena_ready). The only file of the
 * policy that creates physical memory or reserves address ranges; policy_stash_stitch.c maps
 * its memory into stitched ranges, and destroy (policy_stash.c) gives all of it back.
 *
 * Called by policy_stash.c, policy_stash_stitch.c and policy_stash_check.c; calls nothing of
 * the policy's but the blocks' helpers (policy_stash_blocks.h), and the provider.
 *
 * Synchronization: every function here runs under the heap's lock (heap.c).
 */
#include <stdlib.h>
#include <string.h>

#include "policy_stash_blocks.h"

/* ---- Arenas: reserving, growing, shrinking ---------------------------------------------------- */

stash_status_t _stash_sb_va_reserve(stash_heap_t* h, size_t size, uint64_t* out) {
  sb_state* s = S(h);
  uint64_t* ranges =
      _stash_array_grow(s->va_ranges, &s->cap_va_ranges, s->nva_ranges + 2, sizeof *ranges, 8);
  if (!ranges) return _stash_error(STASH_ERR_HOST_OOM, "out of host memory");
  s->va_ranges = ranges;
  stash_status_t st = PCALL(h, va_reserve, h->device, size, out);
  if (st != STASH_OK)
    return st == STASH_ERR_OOM ? st : prov_fail(h, st, "reserve a virtual address range");
  s->va_ranges[s->nva_ranges++] = *out;
  s->va_ranges[s->nva_ranges++] = size;
  return STASH_OK;
}

static stash_status_t arena_reserve(stash_heap_t* h, sb_arena* a) {
  if (a->reserved) return STASH_OK;
  /* Room for everything the device holds, twice: pages given back at the end and mapped
   * again reuse the same addresses, so the range never runs out. */
  size_t size = round_up(2 * h->device_total, G);
  stash_status_t st = _stash_sb_va_reserve(h, size, &a->base);
  if (st != STASH_OK) return st;
  a->va_size = size;
  a->reserved = true;
  return STASH_OK;
}

/* Map new memory at the arena's end: need_pages, or (unless `exact`) at least the arena's
 * growth step when the limit and the device allow it. The memory is made of physical
 * allocations of at most cap_bytes each (a stitched range can only map whole ones: the
 * driver maps nothing smaller), mapped one by one and made accessible with one call - or,
 * `lazy` (memory for a stitched range), only created: arena_ready maps it on first use. */
stash_status_t _stash_sb_arena_grow(stash_heap_t* h, sb_arena* a, size_t need_pages,
                                    uint32_t slot, bool exact, size_t cap_bytes, bool lazy) {
  sb_state* s = S(h);
  stash_status_t st = arena_reserve(h, a);
  if (st != STASH_OK) return st;
  size_t step = exact ? 0 : a->grow_bytes / G;
  size_t limit = a->small ? 0 : piece_limit(h); /* max_piece_size_mb */
  if (limit && cap_bytes > limit) cap_bytes = limit;
  bool loading = !a->small && !s->freed; /* nothing freed yet: every byte grown stays */
  bool scattered = false; /* freed memory the requests cannot use: no burst */
  size_t want = 0;        /* the block it grows for: the free end it extends and new pages */
  if (!a->small && !exact) {
    size_t fresh = a->free_bytes > a->free_at_grow ? a->free_bytes - a->free_at_grow : 0;
    want = need_pages * G + free_tail(a, slot);
    scattered = a->free_bytes >= kBurstMax && fresh / kScatterTimes >= want;
  }
  size_t free_was = a->free_bytes;
  /* after the first drop, a long run of allocations that frees nothing (state being made) */
  bool run = !a->small && !exact && !scattered && s->dropped && !s->tight &&
             s->nallocs - s->allocs_at_free >= kRunAllocs;
  if (!exact && !scattered && (a->small || !s->dropped || run) && a->last_grow_pages &&
      (loading || run || s->nallocs - a->allocs_at_last_grow <= kBurstAllocs)) {
    size_t burst = 2 * a->last_grow_pages; /* growing again soon after the last time */
    size_t cap = (a->small ? kSmallBurstMax : loading ? kLargePieceMax : kBurstMax) / G;
    if (limit && cap > limit / G) cap = limit / G; /* a burst of one piece at most */
    if (burst > cap) burst = cap;
    if (burst > step) step = burst;
  }
  /* After the first drop the least growth stays for the small requests whose growths it
   * spares; a large request that mostly fits the free end gets no runt past it (at the second
   * step's peak that runt is reserved and unused) - but not in a heap turned tight, where at
   * the device's limit it needed larger devices as often as smaller (docs/policy-stash.md,
   * "Thirty-second session") */
  if (!a->small && !exact && s->dropped && !s->tight && want >= kExactGrowFrom && !run) step = 0;
  size_t pages = need_pages > step ? need_pages : step;
  if (h->has_limit && h->total_reserved + pages * G > h->allowed_max) pages = need_pages;
  if (a->mapped + pages * G > a->va_size) pages = need_pages; /* the step is a wish */
  if (h->has_limit && h->total_reserved + pages * G > h->allowed_max) return STASH_ERR_OOM;
  if (a->mapped + pages * G > a->va_size)
    return _stash_error(STASH_ERR_OOM, "arena address range exhausted");
  size_t max_pages = cap_bytes / G ? cap_bytes / G : 1;
  size_t nh = (pages + max_pages - 1) / max_pages;
  sb_handle* handles =
      _stash_array_grow(a->handles, &a->cap_handles, a->nhandles + nh, sizeof *handles, 32);
  if (!handles) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  a->handles = handles;
  sb_block* b = block_new(s);
  if (!b) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  uint64_t va = a->base + a->mapped;
  size_t made = 0, mapped = 0, k = 0; /* pages created, pages mapped, handles */
  sb_handle* hs = a->handles + a->nhandles; /* the new ones, recorded past the end for now */
  while (made < pages) {
    size_t np = pages - made < max_pages ? pages - made : max_pages;
    uint64_t handle = 0;
    st = PCALL(h, phys_create, h->device, np * G, &handle);
    if (st == STASH_ERR_OOM && made == 0 && k == 0 && pages > need_pages) {
      pages = need_pages; /* the step is a wish: try exactly what is needed */
      nh = (pages + max_pages - 1) / max_pages;
      continue;
    }
    if (st != STASH_OK) {
      if (st != STASH_ERR_OOM) st = prov_fail(h, st, "create physical memory");
      goto undo;
    }
    hs[k++] = (sb_handle){(a->mapped / G) + made, np, handle, lazy ? H_UNMAPPED : H_READY};
    made += np;
    if (lazy) continue;
    st = PCALL(h, map, h->device, va + (made - np) * G, np * G, handle, 0);
    if (st != STASH_OK) {
      st = prov_fail(h, st, "map physical memory");
      goto undo;
    }
    mapped = made;
  }
  bool dead = false;
  if (!lazy) st = PCALL(h, set_access, h->device, va, pages * G);
  if (st != STASH_OK) {
    st = prov_fail(h, st, "set access to mapped memory");
    goto undo;
  }
keep:
  if (!exact && !a->small) a->free_at_grow = free_was;
  if (!exact && !dead && !scattered) { /* a scattered growth leaves the burst chain be */
    a->last_grow_pages = pages;
    a->allocs_at_last_grow = s->nallocs;
  }
  if (lazy && k && (!a->nlazy || hs[0].first_page < a->lazy_from)) a->lazy_from = hs[0].first_page;
  a->nhandles += k;
  if (lazy) a->nlazy += k;
  a->mapped += pages * G;
  h->total_reserved += pages * G;
  stat_inc(h->stats.segment, a->small, k);
  stat_inc(h->stats.reserved_bytes, a->small, pages * G);
  h->stats.num_device_alloc++;
  b->kind = K_FREE;
  b->arena = a;
  b->ptr = va;
  b->size = pages * G;
  b->tag = 0;
  b->epoch = 0;
  if (a->last && a->last->kind == K_FREE &&
      (!tag_ok(a->last, slot) || !tags_merge(s, 0, a->last->tag))) {
    /* The free end belongs to another stream for now: keep the new memory apart from it
     * (merged, it would take that stream's tag) by giving it to `slot`, for now. Or it is
     * slot's own, and slot does not lead: untagged, the new memory would stay apart from it
     * (tags_merge); slot's, it joins it. */
    b->tag = slot;
    b->epoch = s->streams[slot].epoch_next;
    s->streams[slot].dirty = true;
  }
  b->prev = a->last;
  b->next = NULL;
  if (a->last) a->last->next = b;
  else a->first = b;
  a->last = b;
  if (dead) b->kind = K_DEAD;
  else free_coalesce(s, b);
  _stash_history_add(h, STASH_TRACE_SEGMENT_MAP, va, pages * G, NULL);
  return st; /* STASH_OK, or the set_access error when the memory is dead */
undo:
  /* Unmap and release what was made, newest first. A mapping the driver will not undo
   * keeps everything made so far in the arena, as dead memory that empty_cache retries. */
  while (k > 0) {
    sb_handle* x = &hs[k - 1];
    size_t off = x->first_page - a->mapped / G;
    if (off < mapped && PCALL(h, unmap, h->device, va + off * G, x->npages * G) != STASH_OK) {
      pages = off + x->npages; /* handles [0, k) stay, as dead memory */
      dead = true;
      goto keep;
    }
    if (PCALL(h, phys_release, h->device, x->handle) != STASH_OK)
      _stash_zombies_add(&S(h)->zombies, 0, x->npages * G, x->handle);
    mapped = off < mapped ? off : mapped;
    k--;
  }
  block_delete(s, b);
  return st;
}

/* Count one physical allocation of `bytes` at va made (true) or given back (false): reserved
 * bytes, segments, the provider calls, and the history's map / unmap event. */
static void memory_counted(stash_heap_t* h, const sb_arena* a, uint64_t va, size_t bytes,
                           bool made) {
  if (made) {
    h->total_reserved += bytes;
    stat_inc(h->stats.segment, a->small, 1);
    stat_inc(h->stats.reserved_bytes, a->small, bytes);
    h->stats.num_device_alloc++;
  } else {
    h->total_reserved -= bytes;
    stat_dec(h->stats.segment, a->small, 1);
    stat_dec(h->stats.reserved_bytes, a->small, bytes);
    h->stats.num_device_free++;
  }
  _stash_history_add(h, made ? STASH_TRACE_SEGMENT_MAP : STASH_TRACE_SEGMENT_UNMAP, va, bytes,
                     NULL);
}

/* Give back the physical allocations lying wholly in the free end of an arena (and mapped
 * by no stitched range: one whose unmap failed keeps its memory). */
stash_status_t _stash_sb_arena_shrink(stash_heap_t* h, sb_arena* a) {
  sb_state* s = S(h);
  while (a->nhandles) {
    sb_block* t = a->last;
    sb_handle* hd = &a->handles[a->nhandles - 1];
    uint64_t start = a->base + hd->first_page * G;
    size_t bytes = hd->npages * G;
    if (hd->access == H_RELEASED) { /* given back already: only its addresses go */
      if (!t || t->kind != K_VOID || t->ptr != start) return STASH_OK;
      unlink_block(t);
      block_delete(s, t);
      a->nhandles--;
      a->nreleased--;
      a->released -= bytes;
      a->mapped -= bytes;
      continue;
    }
    if (!t || t->kind != K_FREE || t->ptr > start) return STASH_OK;
    if (ranged_pages(a, hd->first_page, hd->npages)) return STASH_OK;
    stash_status_t st = hd->access == H_UNMAPPED ? STASH_OK : PCALL(h, unmap, h->device, start, bytes);
    if (st != STASH_OK) return prov_fail(h, st, "unmap memory");
    stash_status_t released = PCALL(h, phys_release, h->device, hd->handle);
    if (released != STASH_OK) {
      /* Unmapped but not released: the arena lets it go all the same; the release is
       * tried again by the next empty_cache, and at the latest by destroy. */
      _stash_zombies_add(&S(h)->zombies, 0, bytes, hd->handle);
    }
    free_remove(s, t);
    if (t->ptr == start) {
      unlink_block(t);
      block_delete(s, t);
    } else {
      t->size = start - t->ptr;
      free_insert(s, t);
    }
    a->nhandles--;
    if (hd->access != H_READY) a->nlazy--;
    a->mapped -= bytes;
    memory_counted(h, a, start, bytes, false);
    if (released != STASH_OK) return prov_fail(h, released, "release physical memory");
  }
  return STASH_OK;
}

/* empty_cache's second half: give back every physical allocation of the arena that lies
 * wholly in a free block - between live blocks, where arena_shrink cannot reach - and that no
 * stitched range maps. Its addresses stay the arena's, as a K_VOID block (the arena's tiling
 * and the offsets turn replay remembers do not move); arena_take_back makes memory there
 * again when the arena would otherwise grow. On a failed unmap the allocation stays, free.
 * An allocation in a free block of keep_from bytes or more stays (SIZE_MAX: none does). */
stash_status_t _stash_sb_arena_give_back(stash_heap_t* h, sb_arena* a, size_t keep_from) {
  sb_state* s = S(h);
  for (size_t i = 0; i < a->nhandles; i++) {
    sb_handle* hd = &a->handles[i];
    if (hd->access == H_RELEASED || ranged_pages(a, hd->first_page, hd->npages)) continue;
    uint64_t start = a->base + hd->first_page * G;
    size_t bytes = hd->npages * G;
    sb_block* fb = free_containing(a, start, bytes);
    if (!fb || fb->tag != 0 || fb == a->last) continue; /* the free end is arena_shrink's */
    if (fb->size >= keep_from) continue; /* kept whole for a request that large */
    sb_block *pre, *post;
    if (!carve_spares(s, fb, start, bytes, &pre, &post))
      return _stash_error(STASH_ERR_HOST_OOM, "empty_cache: out of host memory");
    if (hd->access != H_UNMAPPED) {
      stash_status_t st = PCALL(h, unmap, h->device, start, bytes);
      if (st != STASH_OK) {
        if (pre) block_delete(s, pre);
        if (post) block_delete(s, post);
        return prov_fail(h, st, "unmap memory");
      }
    }
    stash_status_t released = PCALL(h, phys_release, h->device, hd->handle);
    if (released != STASH_OK) _stash_zombies_add(&s->zombies, 0, bytes, hd->handle);
    if (hd->access != H_READY) a->nlazy--;
    hd->access = H_RELEASED;
    hd->handle = 0;
    sb_block* v = carve(s, fb, start, bytes, pre, post);
    v->kind = K_VOID;
    a->released += bytes;
    a->nreleased++;
    memory_counted(h, a, start, bytes, false);
    if (released != STASH_OK) return prov_fail(h, released, "release physical memory");
  }
  return STASH_OK;
}

/* Memory again behind the allocation empty_cache gave back at v (a K_VOID block), in place.
 * On a failure (STASH_ERR_OOM when the device is full) its calls are undone and v stays void
 * - unless the mapping refused access would not go: then it is held as dead memory, as
 * arena_grow keeps it, and empty_cache retries it. */
static stash_status_t take_back_one(stash_heap_t* h, sb_arena* a, sb_block* v) {
  sb_state* s = S(h);
  sb_handle* hd = &a->handles[_stash_sb_handle_after(a, (size_t)(v->ptr - a->base) / G)];
  uint64_t start = v->ptr;
  size_t bytes = v->size;
  if (h->has_limit && h->total_reserved + bytes > h->allowed_max) return STASH_ERR_OOM;
  uint64_t handle = 0;
  stash_status_t st = PCALL(h, phys_create, h->device, bytes, &handle);
  if (st != STASH_OK) return st == STASH_ERR_OOM ? st : prov_fail(h, st, "create physical memory");
  const char* what = "map physical memory";
  st = PCALL(h, map, h->device, start, bytes, handle, 0);
  bool dead = false; /* mapped, refused access, and the mapping would not go */
  if (st == STASH_OK) {
    st = PCALL(h, set_access, h->device, start, bytes);
    what = "set access to mapped memory";
    if (st != STASH_OK) dead = PCALL(h, unmap, h->device, start, bytes) != STASH_OK;
  }
  if (st != STASH_OK && !dead) {
    if (PCALL(h, phys_release, h->device, handle) != STASH_OK)
      _stash_zombies_add(&s->zombies, 0, bytes, handle);
    return prov_fail(h, st, what);
  }
  hd->handle = handle;
  hd->access = H_READY;
  a->released -= bytes;
  a->nreleased--;
  memory_counted(h, a, start, bytes, true);
  if (dead) {
    v->kind = K_DEAD;
    return prov_fail(h, st, what);
  }
  v->kind = K_FREE;
  v->tag = 0;
  v->epoch = 0;
  free_coalesce(s, v);
  return STASH_OK;
}

/* Memory again behind every given-back block from b up to address end, in order (each
 * take_back_one); the first failure stops it. */
static stash_status_t take_back_until(stash_heap_t* h, sb_arena* a, sb_block* b, uint64_t end) {
  for (; b && b->ptr < end; b = b->next) {
    if (b->kind != K_VOID) continue;
    stash_status_t st = take_back_one(h, a, b); /* b, merged with its free neighbours, stays */
    if (st != STASH_OK) return st;
  }
  return STASH_OK;
}

/* Before the arena grows at its end for a request of `size` (stream slot `slot`) that no free
 * block holds: memory again behind what empty_cache gave back (arena_give_back) where that
 * makes room for it - the smallest run of free and given-back blocks side by side that holds
 * it, each given-back allocation in the run made again in place. STASH_OK with nothing done
 * when no run holds it (the arena grows instead); a failure as take_back_one's. */
stash_status_t _stash_sb_arena_take_back(stash_heap_t* h, sb_arena* a, size_t size, uint32_t slot) {
  sb_block *best = NULL, *run = NULL;
  size_t best_bytes = SIZE_MAX, bytes = 0;
  bool has_void = false;
  for (sb_block* b = a->first;; b = b->next) {
    bool joins = b && (b->kind == K_VOID || (b->kind == K_FREE && tag_ok(b, slot)));
    if (joins) {
      if (!run) run = b, bytes = 0, has_void = false;
      bytes += b->size;
      has_void |= b->kind == K_VOID;
      continue;
    }
    if (run && has_void && bytes >= size && bytes < best_bytes) best = run, best_bytes = bytes;
    run = NULL;
    if (!b) break;
  }
  /* the run's end: merges do not move it */
  return best ? take_back_until(h, a, best, best->ptr + best_bytes) : STASH_OK;
}

/* Turn replay after empty_cache: memory again behind the given-back allocations under
 * [at, at + size) when free and given-back blocks alone cover it, so that the block goes
 * where its counterpart went (its turn's layout holds across an empty_cache). STASH_OK with
 * nothing done otherwise; a failure as take_back_one's. */
stash_status_t _stash_sb_take_back_range(stash_heap_t* h, sb_arena* a, uint64_t at, size_t size,
                                         uint32_t slot) {
  sb_block* b = a->first;
  while (b && b->ptr + b->size <= at) b = b->next;
  bool any = false;
  for (sb_block* c = b; c && c->ptr < at + size; c = c->next) {
    if (c->kind == K_VOID) any = true;
    else if (c->kind != K_FREE || !tag_ok(c, slot)) return STASH_OK;
  }
  return any ? take_back_until(h, a, b, at + size) : STASH_OK;
}

/* Try again to make dead memory accessible. */
stash_status_t _stash_sb_arena_revive(stash_heap_t* h, sb_arena* a) {
  sb_state* s = S(h);
  for (;;) {
    sb_block* b = a->first;
    while (b && b->kind != K_DEAD) b = b->next;
    if (!b) return STASH_OK;
    stash_status_t st = PCALL(h, set_access, h->device, b->ptr, b->size);
    if (st != STASH_OK) return prov_fail(h, st, "set access to mapped memory");
    b->kind = K_FREE;
    b->tag = 0;
    b->epoch = 0;
    free_coalesce(s, b);
  }
}

/* The index of the first physical allocation of arena a that ends after page p. */
size_t _stash_sb_handle_after(const sb_arena* a, size_t p) {
  size_t i = 0, j = a->nhandles;
  while (i < j) {
    size_t m = (i + j) / 2;
    if (a->handles[m].first_page + a->handles[m].npages <= p) i = m + 1;
    else j = m;
  }
  return i;
}

bool _stash_sb_arena_unready(const stash_heap_t* h, const sb_arena* a, uint64_t ptr,
                             size_t size) {
  size_t lo = (size_t)(ptr - a->base) / G, hi = (size_t)(ptr + size - a->base + G - 1) / G;
  if (!a->nlazy || hi <= a->lazy_from) return false;
  for (size_t i = _stash_sb_handle_after(a, lo); i < a->nhandles && a->handles[i].first_page < hi;
       i++)
    if (a->handles[i].access != H_READY) return true;
  return false;
}

/* Make [ptr, ptr + size) of the large arena usable before a block there is handed out: map
 * and make accessible the physical allocations under it that were made for a stitched range
 * and not yet mapped at their arena address. On an error nothing is handed out; what was
 * mapped stays mapped (and an allocation mapped but refused access is retried next time). */
stash_status_t _stash_sb_arena_ready(stash_heap_t* h, sb_arena* a, uint64_t ptr, size_t size) {
  /* arena_ready (policy_stash.h), the only caller, has found an allocation under the block
   * still waiting to be mapped: a->nlazy > 0 and hi > a->lazy_from */
  size_t lo = (size_t)(ptr - a->base) / G, hi = (size_t)(ptr + size - a->base + G - 1) / G;
  for (size_t i = _stash_sb_handle_after(a, lo); i < a->nhandles && a->handles[i].first_page < hi;
       i++) {
    sb_handle* hd = &a->handles[i];
    if (hd->access == H_READY) continue;
    uint64_t va = a->base + hd->first_page * G;
    stash_status_t st = STASH_OK;
    if (hd->access == H_UNMAPPED) {
      st = PCALL(h, map, h->device, va, hd->npages * G, hd->handle, 0);
      if (st != STASH_OK) return prov_fail(h, st, "map physical memory");
      hd->access = H_NOACCESS;
    }
    st = PCALL(h, set_access, h->device, va, hd->npages * G);
    if (st != STASH_OK) return prov_fail(h, st, "set access to mapped memory");
    hd->access = H_READY;
    a->nlazy--;
  }
  return STASH_OK;
}
