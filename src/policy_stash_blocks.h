/* policy_stash_blocks.h: policy:stash's blocks - the chain of blocks that tiles an arena,
 * by address, and the ordered sets of its free blocks (by size and address for each stream
 * tag; by address), with what changes them: insert, remove, merge a free block with its free
 * neighbours (free_coalesce), carve a piece out of a free block (carve). Private: not
 * installed.
 *
 * Static inline, in every file of the policy that includes it: the allocation path
 * (policy_stash.c) runs on these, and the cold files (policy_stash_arena.c,
 * policy_stash_stitch.c, policy_stash_check.c) change and read the same blocks - each its
 * own copy, so that no call on the hot path crosses files.
 *
 * Synchronization: every function here runs under the heap's lock (heap.c).
 */
#ifndef STASH_POLICY_STASH_BLOCKS_H
#define STASH_POLICY_STASH_BLOCKS_H

#include <stdlib.h>
#include <string.h>

#include "policy_stash.h"

/* ---- Ordered sets ------------------------------------------------------------------------ */

static inline int cmp_u64(uint64_t a, uint64_t b) { return a < b ? -1 : a > b ? 1 : 0; }

static inline int cmp_size(const bs_node_t* a, const bs_node_t* b) {
  const sb_block* x = FROM_SNODE(a);
  const sb_block* y = FROM_SNODE(b);
  if (x->size != y->size) return x->size < y->size ? -1 : 1;
  return cmp_u64(x->ptr, y->ptr);
}

static inline int cmp_addr(const bs_node_t* a, const bs_node_t* b) {
  return cmp_u64(FROM_ANODE(a)->ptr, FROM_ANODE(b)->ptr);
}

/* The sets' orders as key fields (blockset.c compares them inline): (size, address) from a
 * block's snode, its address from its anode. */
_Static_assert(sizeof(size_t) == 8 && sizeof(uint64_t) == 8, "64-bit keys");
#define SNODE_KEY(f) ((ptrdiff_t)offsetof(sb_block, f) - (ptrdiff_t)offsetof(sb_block, snode))
#define ANODE_KEY(f) ((ptrdiff_t)offsetof(sb_block, f) - (ptrdiff_t)offsetof(sb_block, anode))
static inline void by_size_init(blockset_t* t) {
  _stash_bs_init_keys(t, cmp_size, 2, SNODE_KEY(size), SNODE_KEY(ptr), 0);
}

static inline sb_block* block_new(sb_state* s) { return _stash_slab_alloc(&s->block_slab); }

/* Spare metadata for carve, which copies a block over it (not zeroed: only what block_delete
 * reads, should it go unused). */
static inline sb_block* spare_new(sb_state* s) {
  sb_block* b = _stash_slab_take(&s->block_slab);
  if (b) b->uses = NULL;
  return b;
}

static inline void block_delete(sb_state* s, sb_block* b) {
  if (b->uses) free(b->uses);
  _stash_slab_free(&s->block_slab, b);
}

/* A tagged free block (detached) at the head of its tag's list. */
static inline void tag_push(sb_state* s, sb_block* b) {
  if (b->tag) {
    sb_stream* st = &s->streams[b->tag];
    b->tprev = NULL;
    b->tnext = st->thead;
    if (st->thead) st->thead->tprev = b;
    st->thead = b;
  }
}

/* Insert a free block into its arena's sets and its tag's list. `place`: a free block that
 * leaves the sets (free_detach'ed) as b comes in, b lying between the same free neighbours
 * by address: b takes its place in the address set without a search, and in the size set
 * too when its size orders there as well - or NULL. */
static inline void free_insert_at(sb_state* s, sb_block* b, sb_block* place) {
  sb_arena* a = b->arena;
  blockset_t* by_size = &a->by_size[b->tag];
  if (place && place->tag == b->tag) {
    bs_node_t* lo = _stash_bs_prev(&place->snode);
    bs_node_t* hi = _stash_bs_next(&place->snode);
    if ((!lo || cmp_size(lo, &b->snode) < 0) && (!hi || cmp_size(&b->snode, hi) < 0))
      _stash_bs_replace(by_size, &place->snode, &b->snode);
    else {
      _stash_bs_erase(by_size, &place->snode);
      _stash_bs_insert(by_size, &b->snode);
    }
  } else {
    if (place) _stash_bs_erase(&a->by_size[place->tag], &place->snode);
    _stash_bs_insert(by_size, &b->snode);
  }
  if (place) _stash_bs_replace(&a->by_addr, &place->anode, &b->anode);
  else _stash_bs_insert(&a->by_addr, &b->anode);
  a->free_bytes += b->size;
  if (place) a->free_bytes -= place->size;
  tag_push(s, b);
}

static inline void free_insert(sb_state* s, sb_block* b) { free_insert_at(s, b, NULL); }

/* Take a free block out of its tag's list, leaving it in its sets, for a block to take its
 * place there (free_insert_at) or for free_remove. */
static inline void free_detach(sb_state* s, sb_block* b) {
  if (b->tag) {
    if (b->tprev) b->tprev->tnext = b->tnext;
    else s->streams[b->tag].thead = b->tnext;
    if (b->tnext) b->tnext->tprev = b->tprev;
    b->tprev = b->tnext = NULL;
  }
}

/* Take a detached free block out of its sets. */
static inline void free_erase(sb_block* b) {
  _stash_bs_erase(&b->arena->by_size[b->tag], &b->snode);
  _stash_bs_erase(&b->arena->by_addr, &b->anode);
  b->arena->free_bytes -= b->size;
}

static inline void free_remove(sb_state* s, sb_block* b) {
  free_detach(s, b);
  free_erase(b);
}

static inline void link_after(sb_block* n, sb_block* b) {
  n->prev = b;
  n->next = b->next;
  if (b->next) b->next->prev = n;
  else b->arena->last = n;
  b->next = n;
}

static inline void unlink_block(sb_block* b) {
  if (b->prev) b->prev->next = b->next;
  else b->arena->first = b->next;
  if (b->next) b->next->prev = b->prev;
  else b->arena->last = b->prev;
}

/* Tags may merge if equal, or if one of them is 0 (usable by any stream) and the other the
 * lead stream's (the one that has made the most allocations): the merged block keeps the
 * stricter tag. A block another stream frees stays apart from its untagged neighbours until
 * its epoch is over: merged, it would keep them from the lead stream until then. */
static inline bool tags_merge(const sb_state* s, uint32_t a, uint32_t b) {
  return a == b || (a == 0 && b == s->lead) || (b == 0 && a == s->lead);
}

/* Whether stream slot `slot` may use free block b now. */
static inline bool tag_ok(const sb_block* b, uint32_t slot) {
  return b->tag == 0 || b->tag == slot;
}

/* b is free and not in the sets: merge it with its free neighbours - into the one before it
 * (or else the one after it), which keeps its place in the address set, its size order
 * checked (or its tag's set changed), and b's metadata is deleted - or, with none, insert it.
 * The merged block takes the stricter tag: the last non-zero one of b's, the next block's
 * and the previous block's; its epoch is the latest. */
static inline void free_coalesce(sb_state* s, sb_block* b) {
  uint32_t tag = b->tag;
  uint64_t epoch = b->epoch;
  sb_block* n = b->next;
  bool mn = n && n->kind == K_FREE && tags_merge(s, tag, n->tag);
  if (mn) {
    if (n->tag) tag = n->tag;
    if (n->epoch > epoch) epoch = n->epoch;
  }
  sb_block* p = b->prev;
  bool mp = p && p->kind == K_FREE && tags_merge(s, tag, p->tag);
  if (mp) {
    if (p->tag) tag = p->tag;
    if (p->epoch > epoch) epoch = p->epoch;
  }
  if (!mn && !mp) {
    free_insert(s, b);
    return;
  }
  sb_arena* a = b->arena;
  sb_block* keep = mp ? p : n;
  size_t add = b->size; /* bytes that join keep's free extent */
  if (mp && mn) {
    free_remove(s, n);
    add += n->size;
    unlink_block(n);
    block_delete(s, n);
  }
  free_detach(s, keep); /* at the head of its tag's list again, as a merged block would be */
  uint32_t old_tag = keep->tag;
  if (keep == n) keep->ptr = b->ptr;
  keep->size += add;
  keep->tag = tag;
  keep->epoch = epoch;
  unlink_block(b);
  block_delete(s, b);
  if (old_tag != tag) {
    _stash_bs_erase(&a->by_size[old_tag], &keep->snode);
    _stash_bs_insert(&a->by_size[tag], &keep->snode);
  } else {
    bs_node_t* hi = _stash_bs_next(&keep->snode); /* it orders higher now: above hi? */
    if (hi && cmp_size(&keep->snode, hi) > 0) {
      _stash_bs_erase(&a->by_size[tag], &keep->snode);
      _stash_bs_insert(&a->by_size[tag], &keep->snode);
    }
  }
  a->free_bytes += add;
  tag_push(s, keep);
}

/* The free block containing [addr, addr + size), or NULL. */
static inline sb_block* free_containing(sb_arena* a, uint64_t addr, size_t size) {
  bs_node_t* x = a->by_addr.root;
  sb_block* best = NULL;
  while (x) {
    sb_block* b = FROM_ANODE(x);
    if (b->ptr <= addr) {
      best = b;
      x = x->right;
    } else {
      x = x->left;
    }
  }
  if (best && addr + size <= best->ptr + best->size) return best;
  return NULL;
}

/* Carve [at, at + size) out of free block b (which contains it); the pieces before and
 * after stay free with b's tag. `pre` and `post` are spare metadata, used or deleted (NULL
 * where that piece cannot exist). Returns the carved block (not in any set, kind to be set by
 * the caller): b, or - where one piece stays free, and b is that piece - a spare. */
static inline sb_block* carve(sb_state* s, sb_block* b, uint64_t at, size_t size, sb_block* pre,
                              sb_block* post) {
  uint64_t end = b->ptr + b->size;
  bool before = at > b->ptr, after = at + size < end;
  if (before != after && (before ? pre : post)) {
    /* One piece stays free: b itself, where it is in the sets - its address order holds, its
     * size order is checked - and the carved block is the spare (no set changes places). */
    sb_block* u = before ? pre : post;
    sb_block* unused = before ? post : pre;
    if (unused) block_delete(s, unused);
    *u = *b;
    memset(&u->snode, 0, sizeof u->snode);
    memset(&u->anode, 0, sizeof u->anode);
    u->tprev = u->tnext = NULL;
    u->ptr = at;
    u->size = size;
    if (after) { /* u, then b */
      u->next = b;
      u->prev = b->prev;
      if (b->prev) b->prev->next = u;
      else b->arena->first = u;
      b->prev = u;
      b->ptr = at + size;
      b->size = end - (at + size);
    } else { /* b, then u */
      link_after(u, b);
      b->size = at - b->ptr;
    }
    bs_node_t* lo = _stash_bs_prev(&b->snode); /* b orders lower now: below lo? */
    if (lo && cmp_size(lo, &b->snode) > 0) {
      _stash_bs_erase(&b->arena->by_size[b->tag], &b->snode);
      _stash_bs_insert(&b->arena->by_size[b->tag], &b->snode);
    }
    if (b->tag) { /* at the head of its tag's list, as a piece in its place would be */
      free_detach(s, b);
      tag_push(s, b);
    }
    b->arena->free_bytes -= size;
    u->tag = 0;
    u->epoch = 0;
    return u;
  }
  free_detach(s, b); /* a piece left free takes b's place in the sets (free_insert_at) */
  sb_block* place = b;
  /* b's size changes while it is still in the sets: the free bytes are set at the end */
  size_t free_after = b->arena->free_bytes - size;
  if (at > b->ptr && pre) { /* callers pass `pre` whenever at > b->ptr */
    *pre = *b;
    memset(&pre->snode, 0, sizeof pre->snode);
    memset(&pre->anode, 0, sizeof pre->anode);
    pre->size = at - b->ptr;
    pre->next = b;
    pre->prev = b->prev;
    if (b->prev) b->prev->next = pre;
    else b->arena->first = pre;
    b->prev = pre;
    b->ptr = at;
    b->size = end - at;
    free_insert_at(s, pre, place);
    place = NULL;
  } else if (pre) {
    block_delete(s, pre);
  }
  if (at + size < end && post) { /* likewise `post` whenever the carve ends early */
    *post = *b;
    memset(&post->snode, 0, sizeof post->snode);
    memset(&post->anode, 0, sizeof post->anode);
    post->ptr = at + size;
    post->size = end - (at + size);
    link_after(post, b);
    b->size = size;
    free_insert_at(s, post, place);
    place = NULL;
  } else if (post) {
    block_delete(s, post);
  }
  if (place) free_erase(b);
  b->arena->free_bytes = free_after;
  b->tag = 0;
  b->epoch = 0;
  return b;
}

/* The spare metadata carve needs to take [at, at + size) out of free block b: a block for the
 * piece before it and one for the piece after, where there is such a piece (else NULL). False,
 * with none kept, when the host is out of memory. */
static inline bool carve_spares(sb_state* s, const sb_block* b, uint64_t at, size_t size,
                                sb_block** pre, sb_block** post) {
  *pre = at > b->ptr ? spare_new(s) : NULL;
  *post = at + size < b->ptr + b->size ? spare_new(s) : NULL;
  if ((at > b->ptr && !*pre) || (at + size < b->ptr + b->size && !*post)) {
    if (*pre) block_delete(s, *pre);
    if (*post) block_delete(s, *post);
    return false;
  }
  return true;
}

#endif
