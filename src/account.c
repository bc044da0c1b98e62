/* account.c: where a heap's reserved bytes are - live, rounding, pending free, lent to
 * stitched blocks, holes, free at segment ends - per pool, read from its segments through
 * stash_heap_visit (so it sees what a snapshot sees, under the heap's lock); and that account
 * in words, as stash-replay --explain and its HTML page print it at the peak. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

typedef struct account_ctx_s {
  stash_account_t* small; /* where each pool's account goes, or NULL */
  stash_account_t* large;
} account_ctx_t;

static int account_segment(const stash_segment_info_t* seg, const stash_block_info_t* b,
                           void* arg) {
  account_ctx_t* c = arg;
  stash_account_t* a = seg->is_small ? c->small : c->large;
  if (!a) return 0;
  if (seg->is_expandable && seg->mapped_size == 0) {
    /* a stitched range (its memory is the arenas', lent) or a reserved range with nothing
     * mapped yet: no memory of its own */
    for (size_t k = 0; k < seg->nblocks; k++)
      if (b[k].state == STASH_BLOCK_ALLOCATED) a->lent_live += b[k].requested_size;
    return 0;
  }
  a->segments++;
  a->reserved += seg->mapped_size;
  size_t last = seg->nblocks; /* the last block with memory behind it */
  for (size_t k = seg->nblocks; k-- > 0;) {
    if (b[k].state != STASH_BLOCK_UNMAPPED) {
      last = k;
      break;
    }
  }
  for (size_t k = 0; k < seg->nblocks; k++) {
    switch (b[k].state) {
      case STASH_BLOCK_ALLOCATED:
        a->live += b[k].requested_size;
        a->rounding += b[k].size - b[k].requested_size;
        break;
      case STASH_BLOCK_PENDING_FREE: a->pending_free += b[k].size; break;
      case STASH_BLOCK_LENT: a->lent += b[k].size; break;
      case STASH_BLOCK_FREE:
        if (k == last) {
          a->ends += b[k].size;
          a->nends++;
        } else {
          a->holes += b[k].size;
          a->nholes++;
          if (b[k].size > a->largest_hole) a->largest_hole = b[k].size;
        }
        break;
      default: break; /* unmapped: no memory; alias: a stitched range's, counted above */
    }
  }
  return 0;
}

stash_status_t stash_heap_accounts(stash_heap_t* heap, stash_account_t* small,
                                   stash_account_t* large) {
  if (!small && !large)
    return _stash_error(STASH_ERR_INVALID, "stash_heap_accounts: both accounts are NULL");
  stash_account_t a[2];
  memset(a, 0, sizeof a);
  account_ctx_t c = {small ? &a[0] : NULL, large ? &a[1] : NULL};
  stash_status_t st = stash_heap_visit(heap, account_segment, &c); /* one view, one lock */
  if (st != STASH_OK) return st;
  if (small) *small = a[0];
  if (large) *large = a[1];
  return STASH_OK;
}

stash_status_t stash_heap_account(stash_heap_t* heap, bool small, stash_account_t* out) {
  if (!out) return _stash_error(STASH_ERR_INVALID, "stash_heap_account: out is NULL");
  return stash_heap_accounts(heap, small ? out : NULL, small ? NULL : out);
}

size_t stash_account_text(const stash_account_t* a, bool small, char* buf, size_t n) {
  if (buf && n) buf[0] = '\0';
  if (!a || !a->segments) return 0;
#define M(x) ((double)(x) / 1048576.0)
#define S(k) (unsigned long long)(k), (k) == 1 ? "" : "s"
  int w = snprintf(buf, buf ? n : 0,
                   "%s pool: %.1f MiB reserved in %llu segment%s = %.1f live + %.1f rounding + "
                   "%.1f pending free + %.1f lent to stitched blocks (%.1f asked for) + %.1f in "
                   "%llu hole%s (the largest %.1f) + %.1f free at %llu segment end%s",
                   small ? "small" : "large", M(a->reserved), S(a->segments), M(a->live),
                   M(a->rounding), M(a->pending_free), M(a->lent), M(a->lent_live), M(a->holes),
                   S(a->nholes), M(a->largest_hole), M(a->ends), S(a->nends));
#undef S
#undef M
  return w > 0 ? (size_t)w : 0;
}
