/* policy_stash.c: stash's own policy - reserve little more than the program has live, and
 * make no driver call once a training loop is in its steady state.
 *
 * Memory is physical allocations mapped into two *arenas*, one for requests of at most
 * 1 MiB and one for the rest. An arena is one long reserved virtual range whose mapped
 * prefix is tiled by blocks; a request takes the best-fitting free block (smallest, then
 * lowest address; in the large arena, the free block at its end - the "top" - only when no
 * other fits, so that it stays whole for a request no hole can serve, as PyTorch's expandable
 * segments keep theirs) and is split off its front at 512-byte granularity; freed blocks merge
 * with free neighbours. Every stream shares the arenas: a block freed on stream A is at once
 * reusable by A, and by other streams once an event recorded on A after the free has
 * completed (a "tag" and an epoch per stream; no event at all with one stream). A stream's
 * epoch is closed (an event recorded on it) when another stream allocates, and - while
 * another stream has allocated within the last kSelfWindow allocations - every kSelfEpoch of
 * its own allocations and every kFreeEpoch of its frees, so that what it frees becomes every
 * stream's before a side stream that allocates now and then asks for it (else each such
 * request would find every freed block still tagged, and grow). Free neighbours merge, the
 * merged block keeping the stricter tag - but a block freed by a stream other than the lead
 * (the one that has made the most allocations) stays apart from untagged memory until its
 * epoch is over: merged, a side stream's small temporary would close a large free block to
 * the main stream (tags_merge). Up to 1 MiB of freed small blocks wait, unmerged, for a
 * request of exactly their size: the fast path (K_CACHED below) - from the stream that freed
 * them, or from any once that stream's epoch is over.
 *
 * Phases of live bytes. While live bytes are under a quarter of their peak so far (once that
 * peak is 256 MiB or more: a model's optimizer state being created, the start of each
 * training step), a large request takes the lowest fitting free block instead of the best
 * fitting one: long-lived blocks pack at the arena's start and leave the rest in large free
 * blocks. Once nothing at all is live (a model deleted), the phases start afresh.
 *
 * When nothing fits, an arena grows at its end: new physical memory, mapped and made
 * accessible, of at least 2 MiB (small arena) or 6 MiB (large). The small arena grows only
 * when the large arena has no free block that fits either: a small request that the small
 * arena cannot fit takes the large arena's best fit first (it still counts as small, by its
 * size, and the loop detector does not see it), so that memory left free by the large
 * requests - between training steps, in the holes of the forward pass - serves the small
 * requests' peaks (an optimizer's step over many small tensors) instead of new memory
 * beside it, and a small arena whose layout drifts in a training loop makes no growth in
 * the steady state. Each physical allocation costs one cuMemSetAccess piece (~19 us:
 * docs/driver-costs.md), so the large arena grows in allocations of up to 192 MiB (1/10 of a
 * request above 1.875 GiB, 1/5 of one of 3.5 GiB or more; one allocation for a request of up
 * to 768 MiB whose size was among the last 64 large requests - a layer's tensor of 204 or 288
 * MiB in one piece, not 192 and 12 or 96), and,
 * until live bytes first fall to half their peak (the first forward pass), a growth that comes
 * within 20 allocations of the last one takes twice the last one's size, up to 64 MiB: fewer,
 * larger pieces while memory first climbs, the exact need afterwards (a burst's unused end
 * near the peak is reserved for nothing: at most 64 MiB of it; afterwards, too, the 6 MiB
 * least growth only for blocks under 12 MiB, where it spares small requests' calls, not as a
 * runt past a large request that mostly fits the free end) - unless the arena holds 64 MiB
 * free and twice the request more than at its last growth: memory freed that the requests
 * cannot use (scattered, not climbing), where a burst would only add to what lies unused at
 * the peak; such a growth is the exact need, and the next one doubles the last burst as if it
 * had not happened. While nothing has been freed
 * since nothing was live - a model's parameters being loaded, every byte grown kept - every
 * growth takes twice the last one's size, however far apart, up to 192 MiB: GPT-2's
 * parameters in 3 allocations, not 14 (what the last burst leaves free, the first forward pass
 * takes). After the first drop, a growth that comes 32 or more allocations after the last
 * free - an optimizer's state being made, tensor after tensor, none freed - doubles the last
 * one's size again, up to 64 MiB: T5-base b3's Adam state in 24 growths, not 92 of 6-10 MiB
 * (a forward pass frees a temporary every few allocations and stays exact; not in a heap
 * turned tight). The small arena bursts likewise, at any time, up to 8 MiB: 2 MiB steps
 * where growth is rare (a late step's few small requests) - up to 6 MiB less reserved for
 * nothing than one 8 MiB step - and 8 MiB ones where it is frequent (an optimizer's state of
 * many 1 MiB tensors being made), so as not to pay four times the calls.
 *
 * A large request (>= 128 MiB) that fits nowhere is *stitched* instead when the holes can
 * give at least a tenth of it in whole physical allocations - or, in the first forward pass
 * (until live bytes first fall to half their peak), half of it in whole allocations, a head
 * and a tail (below): every byte grown there is still needed at the peak the pass climbs to,
 * so a range that takes less would buy nothing and cost its pieces' access calls (ViT's
 * attention would make one in every layer); after it, a tenth less a page in whole
 * allocations, a head and a tail together (a freed block seldom begins or ends exactly at an
 * allocation's edge, so as a head or a tail it gives a little less than its size: Llama's
 * 875 MiB logits beside a freed 234 MiB that no whole allocation lies in are stitched from
 * it, not grown whole - post/llama_b7 97.1% -> 99.9%; half still in a heap turned tight, below,
 * where it needs a smaller device): a fresh virtual range mapped onto physical
 * allocations that are wholly free right now - in the large arena's holes, the largest hole
 * first, then the small arena's (small requests peak at other times than large ones: an
 * optimizer's step against the forward pass), then at the large arena's free end - and, for
 * what is still missing, one new allocation of at most 1 GiB (several for more; 1/64 of a
 * request above 64 GiB each), appended to the arena. A request of 48-128 MiB that fits
 * nowhere is stitched by the same rule, new memory and all, between the first drop of live
 * bytes and a repeating turn (the second step's peak, where the optimizer's state first lies
 * beside the activations: T5-small's 62.8 + 62.8 MiB freed beside a 125.5 MiB request); in the
 * first forward pass, where every byte grown is needed at its peak anyway, and in a turn that
 * turn replay follows, where a new range is a driver call the next turn may make again (ViT-B
 * b88: 10 in its second half), only when whole free allocations - the holes', the small
 * arena's, the free end's - cover all of it, with no new memory (T5-small's 94 MiB logits
 * while the small arena holds the optimizer's idle memory); otherwise the arena grows. A
 * smaller large request is stitched only that way too, from whole free allocations that cover
 * it - except while the heap is tight or pressed (below), where it grows: there, measured at
 * the device's limit, the smallest device rose on 9 traces (by up to 74 MiB) and fell on 11
 * (ResNet-50 b16's backward pass: 97.46% -> 98.02%; docs/policy-stash.md, "Thirty-first
 * session"). The driver maps whole physical allocations only, never a part
 * (tools/gpu/probe_map.txt), but a range need not use all it maps: when it would take new
 * memory, it may begin with an allocation of which only the end is free (its "head": the
 * free end of a hole that does not hold it whole) and end with one of which only the start
 * is free (its "tail"), the block running from the head's free part to within the tail's -
 * the largest such free parts in the arena, each of at least 2 MiB. Its tail may also be a
 * whole allocation of the arena's free end larger than what the head and the holes leave
 * missing, when it covers that: no new memory then (a whole allocation is otherwise taken
 * only where it fits the count, and one larger than what is missing would lie free beside
 * new memory made for the same range); a tail in a partly free allocation gives only what
 * the head and the holes' whole allocations leave, so that none of those is skipped for want
 * of room between head and tail (not in a heap turned tight). A range for a request under
 * 64 MiB has a head or a tail in a hole only of 8 MiB or more, and none while a free cached
 * range would hold the request but is not free as it was: smaller edges would be a few MiB
 * beside blocks of a few MiB, which take them in the next turn, and a range remade turn after
 * turn is a driver call in the steady state (with edges of 6 MiB T5-base b5 calls 6 times in
 * its second half; Swin-T b24, whose 55.5 MiB range loses its head to the next step's blocks,
 * 14 times with a new range every step; docs/policy-stash.md, "Twenty-eighth session"). The
 * range's memory in use is lent to it: while the stitched block lives, it is carved out of its
 * arenas as "phantom" blocks, so no arena can hand it out twice; when it is freed it returns
 * to them. Small requests keep off the pages that a range maps - the small arena's, and the
 * large arena's when the small arena cannot fit them - while other memory fits them (the best
 * fitting block elsewhere, among the first 64; in the large arena, not its free end), and a
 * block freed on such a page is not kept in the fast path's cache: a range whose memory is
 * free again serves its block again without a new range. New allocations are mapped at the
 * range only; at their place in the arena not before the arena first hands out a block on
 * them (arena_ready) - a range whose memory serves it turn after turn never pays the second
 * mapping. Stitched ranges stay mapped and serve later requests of a similar size (at most
 * twice as large) whenever their memory is free again, or, if blocks have since taken a
 * little of one end, whenever the block fits a little further along - so once a training
 * loop repeats, every request finds the same memory as in the previous iteration and no
 * driver call is made.
 *
 * Turn replay: a training loop repeats its allocations turn after turn, but best fit alone
 * lets the layout drift (the blocks that live across a turn's start sit a little
 * differently each time) until some step needs more memory. loop.c watches the large
 * blocks' allocations and frees; once a turn repeats the last (kWindow events of it have,
 * with the same bytes live as a turn earlier), a large request first
 * tries the address its counterpart got one turn earlier (for a block whose counterpart
 * still lives, the address of the block of its size that one lived beside: two turns
 * earlier, where the turns align), if that memory is free now; a block whose counterpart
 * was stitched tries that range, if it is cached and free as it was (replay_range). If it is
 * not, the block goes to the best
 * fitting free block that stays clear of where the allocations its counterpart lived beside
 * went (loop.c's forecast), so as not to take what the rest of the turn will want; only
 * then plain best fit (or stitching) - so the layout, once it repeats, keeps repeating. With
 * several streams too: the loop detector sees the program's allocations in the order the host
 * makes them, and a hinted place is taken only where the stream may use it (its tag).
 *
 * A step's fates. Turn replay repeats a layout; it cannot make one. Where it offers no hint
 * (a second step, whose live bytes exceed the first's by the optimizer's state, is no turn of
 * it), a large request asks fate.c what its counterpart - the previous training step's
 * allocation of its size after the same four large events - did around that step's huge
 * requests (512 MiB or more: a language model's logits): freed between the first and the last
 * of them (Llama's key/value cache), it goes to the top of the highest free block that holds
 * it, carved from that block's end; living past the last (the activations the backward pass
 * needs), to the lowest fitting block. The blocks freed around the logits then lie together,
 * above the ones that stay, and what they free when the logits come is one stretch reaching
 * the arena's free end instead of a hole between every layer's live blocks (hf/llama_b8:
 * 94.95% -> 99.88%). Other requests, and every request of a run without huge requests, are
 * placed as before. With several streams too, as turn replay.
 *
 * A full device. When the device (or the memory fraction) cannot hold the memory a request
 * needs as the rules above place it, a request of 48 MiB or more is placed again "pressed":
 * stitched from every whole free allocation and the best head and tail, with new memory only
 * for the rest, however small a share of it they give (under pressure a range costs less than
 * an out-of-memory error). If that does not fit either, the cache is released (below) and the
 * request tried once more, pressed. With max_piece_size_mb (STASH_CONF), the large arena
 * makes no physical allocation larger - its growths, bursts and a range's new memory alike -
 * so that the memory a freed block leaves is more often whole allocations, which a range can
 * map: for a run at its device's limit, at the price of more driver calls (README, "At the
 * device's limit"). Without the setting, a heap that holds kTightPct percent or more of what
 * it may hold (the device, or the memory fraction) when live bytes first fall to half their
 * peak - the end of a first training step that filled the device - turns *tight*: it gives
 * back its wholly free physical allocations there (as empty_cache does; not during a CUDA
 * graph capture) but those in a free block that holds the largest request so far, makes no
 * large-arena allocation over kTightPiece from then on, and leaves what it gave back between
 * live blocks unmapped unless the arena's address range runs out: the next steps' memory then
 * comes in small pieces, which ranges can map when their blocks are freed. A heap that first
 * holds that much later, at a large request after the first drop, turns tight there, keeping
 * its cache. A run with room to spare never turns tight.
 *
 * empty_cache (and the out-of-memory fallback) waits for pending events and for streams
 * that freed blocks, unmaps the free stitched ranges and gives back the physical
 * allocations that lie wholly in free memory (arena_give_back). A request larger than the
 * device, or than the memory fraction allows, is refused at once, the cache kept: nothing
 * released could make room for it. Memory the driver refuses to
 * take back is retried later ("zombies"); memory it refuses access to is held apart
 * ("dead") and retried.
 *
 * Files. This one holds placement, allocation and free, streams and their epochs, release and
 * lifetime - the hot path, in one translation unit; policy_stash_arena.c reserves, grows,
 * shrinks, gives back and takes back the arenas' physical memory; policy_stash_stitch.c
 * makes, lends and releases stitched ranges; policy_stash_check.c visits the heap and checks
 * its invariants; policy_stash.h (types, constants, the functions the files offer each other)
 * and policy_stash_blocks.h (blocks and the free sets) hold what they share.
 *
 * Synchronization: every function here runs under the heap's lock (heap.c).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy_stash.h"
#include "policy_stash_blocks.h"

/* Live-byte phases count from a peak of kPhaseMinPeak: below 1/kQuietShare of the peak, first
 * fit, comparing at most kFirstFitTries fitting free blocks. */
#define kPhaseMinPeak KNOB_Z(kPhaseMinPeak, (size_t)256 << 20)
#define kQuietShare KNOB_I(kQuietShare, 4)
#define kFirstFitTries KNOB_I(kFirstFitTries, 256)
/* Rule switches for experiments, 1 = the rule as it is (other builds: always 1): 2 turns off
 * clear_fit (kUseClearFit), the quiet phase's first fit (kUseQuiet) or the step fates'
 * placements (kUseFates); kFirstFitAll=2 puts every large block with no turn hint at the
 * lowest fit. docs/policy-stash.md, "Forty-third session", measured each. */
#define kUseClearFit KNOB_I(kUseClearFit, 1)
#define kUseQuiet KNOB_I(kUseQuiet, 1)
#define kUseFates KNOB_I(kUseFates, 1)
#define kFirstFitAll KNOB_I(kFirstFitAll, 1)

#ifdef STASH_POLICY_KNOBS
/* STASH_KNOB_ARM (experiment builds): the STASH_KNOB_ settings act in one phase of the run
 * only, the compiled-in values elsewhere - "first-pass": until live bytes first fall to half
 * their peak, and again after everything is freed (the policy's own phases start afresh
 * there: `dropped`); "drop": from the first such fall on, for good; "step": from fate.c's
 * first step end on, for good. One flag for the process (knob() has no heap): set by the
 * heap that allocates, so with several heaps (one per device) it follows whichever
 * allocated last. */
int _stash_knob_armed;
static void knob_arm(const sb_state* s) {
  const char* arm = getenv("STASH_KNOB_ARM");
  if (!arm) return;
  if (!strcmp(arm, "first-pass")) _stash_knob_armed = !s->dropped;
  else if (!strcmp(arm, "drop")) _stash_knob_armed = _stash_knob_armed || s->dropped;
  else if (!strcmp(arm, "step"))
    _stash_knob_armed = _stash_knob_armed || _stash_fate_stepped(&s->fate);
  else {
    fprintf(stderr, "STASH_KNOB_ARM=%s: not first-pass, drop or step\n", arm);
    abort();
  }
}
#else
#define knob_arm(s) ((void)(s))
#endif

/* ---- Cached blocks (the fast path) -------------------------------------------------------- */

/* Whether the epoch of cached block b's free is over on its stream (b->tag, never 0 for a
 * cached block): every stream may use it. */
static bool cached_epoch_over(const sb_state* s, const sb_block* b) {
  return b->epoch <= s->streams[b->tag].epoch_done;
}

/* Whether stream slot `slot` may take cached block b: the stream that freed it, or any once
 * that stream's epoch of the free is over. */
static bool cached_ok(const sb_state* s, const sb_block* b, uint32_t slot) {
  return b->tag == slot || cached_epoch_over(s, b);
}

/* Merge every cached block into its arena (untagged if its stream's epoch is over, else
 * tagged, in its stream's list until it is). */
static void cache_flush(sb_state* s) {
  if (!s->ncached) return;
  for (size_t i = 0; i < kCacheSizes; i++) {
    for (sb_block* b = s->cache[i]; b;) {
      sb_block* next = b->tnext;
      b->tnext = NULL;
      b->kind = K_FREE;
      if (cached_epoch_over(s, b)) b->tag = 0, b->epoch = 0;
      free_coalesce(s, b); /* merges only K_FREE neighbours: `next`, cached, stays */
      b = next;
    }
    s->cache[i] = NULL;
  }
  s->ncached = 0;
  s->cached_bytes = 0;
}

/* ---- Streams and their epochs --------------------------------------------------------------- */

/* The slot of a stream that has allocated here; 0 for one that has not. */
static uint32_t slot_of(const sb_state* s, void* stream) {
  for (size_t k = 1; k <= s->nstreams; k++)
    if (s->streams[k].stream == stream) return (uint32_t)k;
  return 0;
}

static stash_status_t stream_slot(stash_heap_t* h, void* stream, uint32_t* out) {
  sb_state* s = S(h);
  if ((*out = slot_of(s, stream)) != 0) return STASH_OK;
  size_t k = s->nstreams + 1;
  if (k >= s->cap_streams) {
    size_t cap = s->cap_streams ? s->cap_streams * 2 : 4;
    sb_stream* v = realloc(s->streams, cap * sizeof *v);
    if (!v) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    memset(v + s->cap_streams, 0, (cap - s->cap_streams) * sizeof *v);
    s->streams = v;
    for (int i = 0; i < 2; i++) {
      blockset_t* t = realloc(s->arenas[i].by_size, cap * sizeof *t);
      if (!t) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
      for (size_t j = s->cap_streams; j < cap; j++) by_size_init(&t[j]);
      s->arenas[i].by_size = t;
    }
    s->cap_streams = cap;
  }
  s->streams[k] = (sb_stream){.stream = stream, .epoch_next = 1};
  s->nstreams = k;
  *out = (uint32_t)k;
  return STASH_OK;
}

/* Event items are blocks (their address, even) or epoch markers (odd). */
static void* epoch_marker(uint32_t slot, uint64_t epoch) {
  return (void*)(uintptr_t)(((uint64_t)slot << 40 | epoch) << 1 | 1);
}

/* Epoch `epoch` of `slot` is over on the GPU: its blocks are free for every stream. */
static void epoch_done(stash_heap_t* h, uint32_t slot, uint64_t epoch) {
  sb_state* s = S(h);
  if (epoch > s->streams[slot].epoch_done) s->streams[slot].epoch_done = epoch; /* in order */
  sb_block* b = s->streams[slot].thead;
  while (b) {
    sb_block* next = b->tnext;
    if (b->epoch <= epoch) {
      free_remove(s, b);
      b->tag = 0;
      b->epoch = 0;
      free_coalesce(s, b);
    }
    b = next;
  }
}

static void user_free_complete(stash_heap_t* h, sb_block* b);

static void event_done(stash_heap_t* h, void* item) {
  uintptr_t v = (uintptr_t)item;
  if (v & 1) {
    v >>= 1;
    epoch_done(h, (uint32_t)(v >> 40), v & (((uint64_t)1 << 40) - 1));
    return;
  }
  sb_block* b = item;
  if (--b->event_count == 0) {
    S(h)->pending_uses--;
    user_free_complete(h, b);
  }
}

/* Before stream `slot` allocates: close the epoch of every other stream that freed blocks,
 * with one event each, so that their blocks become usable by all streams when it completes -
 * and its own, every kSelfEpoch of its allocations while another stream has allocated within
 * the last kSelfWindow allocations (a side stream's requests, which come now and then, find
 * memory the main stream freed untagged). On 405 traces given a side stream that takes a small
 * request every 2000 events, issue 4's three targets hold on 316 with it and 130 without (367
 * with one stream); where a second stream is used once at the start, its events cost 5 of
 * them the driver target (362). A window of 4096 allocations keeps those 5 and loses side
 * streams that ask less often (one request of any size every 2000 events: 239, not 282).
 * docs/policy-stash.md, "Forty-fifth session".
 * A stream also closes its own epoch every kFreeEpoch of its frees, under the same window (in
 * sb_free, before the free: the block freed then waits for the next epoch). At a training
 * step's end the main stream frees most of the step's memory and allocates little, and a side
 * stream's request after that found it all still tagged. With tools/side_streams.py's sets
 * (forty-sixth session): a small request every 2000 events 317 -> 353 of 405, one of any
 * size 184 -> 265, the same from event 2000 on 183 -> 236; used once at the start, 362 -> 361
 * (the events' driver time). Every 16 frees: 348 / 276 / 244 / 357; every 64: 353 / 256 /
 * 233 / 361. */
#define kSelfEpoch KNOB_I(kSelfEpoch, 16)
#define kSelfWindow KNOB_I(kSelfWindow, 16384)
#define kFreeEpoch KNOB_I(kFreeEpoch, 32)

/* Whether a stream other than slot k has allocated within the last kSelfWindow allocations. */
static bool others_active(const sb_state* s, size_t k) {
  for (size_t j = 1; j <= s->nstreams; j++)
    if (j != k && s->streams[j].last_alloc + (uint64_t)kSelfWindow >= s->nallocs) return true;
  return false;
}

/* Stream st's blocks freed from now on belong to its next epoch. */
static void epoch_advance(sb_stream* st) {
  st->epoch_next++;
  st->dirty = false;
  st->frees = 0;
}

/* Close stream slot k's epoch: an event on it, after which its blocks freed so far are free
 * for every stream. */
static stash_status_t epoch_close(stash_heap_t* h, size_t k) {
  sb_state* s = S(h);
  sb_stream* st = &s->streams[k];
  stash_status_t r = _stash_events_record(h, &s->events, &st->stream, 1,
                                          epoch_marker((uint32_t)k, st->epoch_next));
  if (r != STASH_OK) return r;
  epoch_advance(st);
  return STASH_OK;
}

static stash_status_t close_epochs(stash_heap_t* h, uint32_t slot) {
  sb_state* s = S(h);
  for (size_t k = 1; k <= s->nstreams; k++) {
    sb_stream* st = &s->streams[k];
    if (!st->dirty) continue;
    if (k == slot) {
      if (s->nstreams < 2 || ++st->allocs < (uint32_t)kSelfEpoch || !others_active(s, k))
        continue;
      st->allocs = 0;
    }
    stash_status_t r = epoch_close(h, k);
    if (r != STASH_OK) return r;
  }
  return STASH_OK;
}

/* Whether free block b has a free neighbour it merges with (tags_merge). */
static bool merges_with_a_neighbour(const sb_state* s, const sb_block* b) {
  return (b->prev && b->prev->kind == K_FREE && tags_merge(s, b->tag, b->prev->tag)) ||
         (b->next && b->next->kind == K_FREE && tags_merge(s, b->tag, b->next->tag));
}

/* Stream slot `slot` has made an eighth more allocations than the lead: it leads now, and its
 * free blocks merge with their untagged neighbours (tags_merge). One merge can make another:
 * an untagged block between two of slot's, merged into the first, leaves it beside the second
 * (found by fuzzing: tests/fuzz/corpus/lead-change-merges-a-chain.csv). And a merge deletes
 * blocks that the list links to, so the walk starts over after each: every merge leaves one
 * free block fewer. */
static void lead_change(sb_state* s, uint32_t slot) {
  s->lead = slot;
  s->lead_lag = 0;
  for (bool merged = true; merged;) {
    merged = false;
    for (sb_block* b = s->streams[slot].thead; b; b = b->tnext) {
      if (merges_with_a_neighbour(s, b)) {
        free_remove(s, b);
        free_coalesce(s, b);
        merged = true;
        break;
      }
    }
  }
}

/* ---- Finding blocks ----------------------------------------------------------------------- */

/* The free blocks of arena a that hold `size` bytes for stream slot `slot`, best first: the
 * smallest, then the lowest, among the blocks any stream may use and the slot's own. */
typedef struct sb_fits_s {
  bs_node_t* any;  /* in by_size[0] */
  bs_node_t* own;  /* in by_size[slot] */
} sb_fits;

static sb_fits fits_begin(sb_arena* a, size_t size, uint32_t slot) {
  a->key.size = size;
  a->key.ptr = 0;
  return (sb_fits){_stash_bs_lower_bound(&a->by_size[0], &a->key.snode),
                   slot ? _stash_bs_lower_bound(&a->by_size[slot], &a->key.snode) : NULL};
}

static sb_block* fits_next(sb_fits* it) {
  bs_node_t** from = &it->any;
  if (!it->any || (it->own && cmp_size(it->own, it->any) < 0)) from = &it->own;
  bs_node_t* n = *from;
  if (n) *from = _stash_bs_next(n);
  return n ? FROM_SNODE(n) : NULL;
}

/* The best fitting free block, except that the large arena's free end (its "top": the free
 * block at the end of its mapped memory) is taken only when no other free block fits. Were it
 * the smallest fit, a request taking it would leave the next larger request to grow the arena,
 * where a hole would have served the first; kept whole, the top serves a request that fits
 * nowhere else (as PyTorch's expandable segments do, which rank the free block before the
 * unmapped rest of a segment by the size it can grow to). */
static sb_block* best_fit(sb_arena* a, size_t size, uint32_t slot) {
  sb_fits it = fits_begin(a, size, slot);
  sb_block* b = fits_next(&it);
  if (b && b == a->last && !a->small) {
    sb_block* other = fits_next(&it);
    if (other) return other;
  }
  return b;
}

/* The lowest free block of arena a that holds `size` bytes for slot `slot`, among the
 * kFirstFitTries best fitting ones; NULL if none. */
static sb_block* first_fit(sb_arena* a, size_t size, uint32_t slot) {
  sb_fits it = fits_begin(a, size, slot);
  sb_block *b, *low = NULL;
  for (int tries = kFirstFitTries; tries-- > 0 && (b = fits_next(&it));)
    if (!low || b->ptr < low->ptr) low = b;
  return low;
}

/* The highest free block of arena a that holds `size` bytes for slot `slot`, among its
 * kFirstFitTries highest free blocks; NULL if none. */
static sb_block* highest_fit(sb_arena* a, size_t size, uint32_t slot) {
  int tries = kFirstFitTries;
  for (bs_node_t* n = _stash_bs_last(&a->by_addr); n && tries-- > 0; n = _stash_bs_prev(n)) {
    sb_block* b = FROM_ANODE(n);
    if (b->size >= size && tag_ok(b, slot)) return b;
  }
  return NULL;
}

/* ---- Allocation and free ---------------------------------------------------------------------- */

static stash_status_t release_cache(stash_heap_t* h);
static stash_status_t release_cache_keep(stash_heap_t* h, size_t keep_from);

/* Turn replay's hint for a large request of `size`: in a repeating turn, the arena offset its
 * counterpart got one turn earlier. */
static bool turn_hint(const sb_state* s, size_t size, uint64_t* off) {
  return _stash_loop_hint(&s->loop, size, off);
}

/* Turn replay for a block whose counterpart was stitched: the same range, number `id`, if it
 * is cached and free as it was and holds the block (range_holds, as stitch_alloc asks of a
 * cached range); its user block (NULL otherwise, or, with *st set, when the host is out of
 * memory). Without it a stitched block of a repeating turn
 * finds no hint, the blocks placed before it take its range's pages, and the turn makes a
 * new range (a driver call) and grows: VGG-11 b64 made six new ranges in its second and third
 * steps and reached 96.8%; given its ranges back, 98.8%. */
static sb_block* replay_range(stash_heap_t* h, uint32_t id, size_t size, uint32_t slot,
                              stash_status_t* st) {
  sb_state* s = S(h);
  sb_stitch* rg = s->stitches;
  while (rg && rg->id != id) rg = rg->next_st;
  if (!rg || !range_holds(h, rg, size) || !_stash_sb_stitch_available(h, rg, slot)) return NULL;
  sb_block* ub = block_new(s);
  if (!ub) {
    *st = _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    return NULL;
  }
  if ((*st = _stash_sb_stitch_lend(h, rg)) != STASH_OK) {
    block_delete(s, ub);
    return NULL;
  }
  range_user(rg, ub, size);
  return ub;
}

/* [at, at + size) of free block fb of arena a, made usable and carved out (kind to be set by
 * the caller); NULL, with *st set, when the provider or the host fails. */
static sb_block* take_at(stash_heap_t* h, sb_arena* a, sb_block* fb, uint64_t at, size_t size,
                         stash_status_t* st) {
  if ((*st = arena_ready(h, a, at, size)) != STASH_OK) return NULL;
  sb_block *pre, *post;
  if (!carve_spares(S(h), fb, at, size, &pre, &post)) {
    *st = _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    return NULL;
  }
  return carve(S(h), fb, at, size, pre, post);
}

static bool may_wait(const stash_heap_t* h);

/* One attempt: a cached block, a stitched block, or a grown arena. */
/* Turn replay: in a loop, a large block goes where its counterpart went one turn earlier
 * if that memory is free now for this stream: its place in the arena, or its stitched range.
 * NULL otherwise, or, with *st set, when the host is out of memory. Where the place is free
 * but another stream's, its epoch open, and usable as it is (mapped), *waitable is its free
 * block and *waitable_at the place (else left as they are): try_alloc may wait for it rather
 * than map memory elsewhere. */
static sb_block* replay(stash_heap_t* h, sb_arena* a, size_t size, uint32_t slot,
                        stash_status_t* st, sb_block** waitable, uint64_t* waitable_at) {
  sb_state* s = S(h);
  uint64_t off = 0;
  if (!turn_hint(s, size, &off)) return NULL;
  if (off & STASH_LOOP_ELSEWHERE) return replay_range(h, (uint32_t)off, size, slot, st);
  uint64_t at = a->base + off;
  sb_block* fb = free_containing(a, at, size);
  if (!fb && a->nreleased && !s->tight) { /* given back by empty_cache: memory there again */
    stash_status_t r = _stash_sb_take_back_range(h, a, at, size, slot);
    if (r != STASH_OK && r != STASH_ERR_OOM) {
      *st = r;
      return NULL;
    }
    fb = free_containing(a, at, size);
  }
  if (fb && !tag_ok(fb, slot) && may_wait(h) && !_stash_sb_arena_unready(h, a, at, size)) {
    *waitable = fb;
    *waitable_at = at;
  }
  if (!fb || !tag_ok(fb, slot)) return NULL;
  return take_at(h, a, fb, at, size, st);
}

/* The best fitting free block of arena a whose front, where the block would go, touches no
 * page a stitched range maps (among the first kClearFitTries fits; in the large arena, not
 * its free end, the last fit there); NULL if none: those pages are the ranges', while other
 * memory serves. */
static sb_block* ranged_fit(stash_heap_t* h, sb_arena* a, size_t size, uint32_t slot) {
  sb_fits it = fits_begin(a, size, slot);
  sb_block* b;
  for (int tries = kClearFitTries; tries-- > 0 && (b = fits_next(&it));)
    if ((a->small || b != a->last) && !ranged_at(h, a, b->ptr, size)) return b;
  return NULL;
}

/* Turn replay's fallback, for a large block whose counterpart address is taken (or whose
 * counterpart was stitched): the best fitting free block - of the first kClearFitTries -
 * whose front stays clear of where the allocations the counterpart lived beside went one turn
 * earlier (_stash_loop_forecast); NULL when there is no forecast or no such block. Placing a
 * block where the rest of its turn will want to go would move them too, turn after turn. */
static sb_block* clear_fit(sb_state* s, sb_arena* a, size_t size, uint32_t slot) {
  size_t n = 0;
  if (!_stash_loop_forecast(&s->loop, size, s->forecast, kForecastMax, &n))
    return NULL;
  sb_fits it = fits_begin(a, size, slot);
  sb_block* b;
  for (int tries = kClearFitTries; tries-- > 0 && (b = fits_next(&it));) {
    uint64_t lo = b->ptr - a->base, hi = lo + size;
    size_t i = 0;
    while (i < n && !(s->forecast[i][0] < hi && lo < s->forecast[i][0] + s->forecast[i][1])) i++;
    if (i == n) return b;
  }
  return NULL;
}

/* Whether a request of kStitchCoverMin to kStitchMin that fits nowhere may take new memory in
 * a stitched range, as larger ones do: once live bytes have first fallen to half their peak
 * (in the first forward pass every byte grown is needed at its peak anyway) and while turn
 * replay has no counterpart for it in the arena (in a repeating turn a new range is a driver
 * call that the next turn may make again, where the arena's growth is made once; a
 * counterpart that was stitched, and whose range is taken, is as none). */
static bool mid_sized_may_grow_a_range(sb_state* s, size_t size) {
  uint64_t off = 0;
  /* a run whose live bytes never halve (weights and optimizer state outweigh the
   * activations: Llama b1) is past its first pass once fate.c has seen a step end */
  bool past_first = s->dropped || _stash_fate_stepped(&s->fate);
  return past_first && (!turn_hint(s, size, &off) || (off & STASH_LOOP_ELSEWHERE));
}

/* The largest physical allocation the large arena grows in for a request of `size`: a
 * repeated size of at most kOnePiecePct percent of kLargePieceMax in one piece (GPT-2 b17's
 * 204 MiB activations: one cuMemSetAccess piece, not 192 MiB and 12; b24's 288 MiB attention
 * scores, 48 of them in its first forward pass, not 192 and 96) - up to 768 MiB: with its
 * 785 MiB logits in one piece the other loop's GPT-2 b4 peaks 583 MB higher, and with 1177
 * MiB ones GPT-2 b6, b7 and two OPT runs lose their memory target (docs/policy-stash.md,
 * "Twenty-ninth session") - else a fifth of a request of kHugeFrom or more (GPT-2
 * b19's 3730 MiB logits: 5 pieces, not 10, that is 5 cuMemCreate and 5 access pieces fewer,
 * ~160 us a growth; at 3141 MiB, GPT-2 b16, pieces that large leave the next step's range
 * half the whole allocations it took), else piece_bytes'. Only a size seen among the last
 * kRecentSizes large requests: a one-off tensor just over the cap (GPT-2 b1's 196 MiB logits)
 * keeps its 192 MiB piece, which a stitched range can take once the tensor is freed. */
static size_t large_piece(stash_heap_t* h, size_t size) {
  const sb_state* s = S(h);
  if (size > kLargePieceMax && size * 100 <= kLargePieceMax * kOnePiecePct) {
    uint64_t n = s->nrecent < kRecentSizes ? s->nrecent : kRecentSizes;
    for (uint64_t k = 0; k < n; k++)
      if (s->recent[k] == size) return round_up(size, G);
  }
  if (size >= kHugeFrom) return piece_bytes(size, kLargePieceMax, kHugePieces, G);
  return piece_bytes(size, kLargePieceMax, kLargePieces, G);
}

/* ---- Waiting for another stream's work ---------------------------------------------------- */

/* Whether a request may wait on the device for another stream's work (stream_waits, stash.h). */
static bool may_wait(const stash_heap_t* h) {
  return S((stash_heap_t*)h)->nstreams >= 2 && !h->capturing && h->conf.stream_waits &&
         h->prov.stream_wait;
}

/* Make stream slot `slot` wait on the device for stream slot `owner`'s work so far: an event on
 * owner's stream after every block it has freed - closing its epoch if it freed blocks since
 * the last close, else the last event it queued on that stream, which follows that close -
 * and cuStreamWaitEvent; counted in num_stream_waits once made. */
static stash_status_t wait_for_owner(stash_heap_t* h, uint32_t slot, uint32_t owner) {
  sb_state* s = S(h);
  sb_stream* o = &s->streams[owner];
  uint64_t ev = 0;
  if (o->dirty || !_stash_events_last(&s->events, o->stream, &ev)) {
    stash_status_t st = epoch_close(h, owner);
    if (st != STASH_OK) return st;
    if (!_stash_events_last(&s->events, o->stream, &ev))
      return _stash_error(STASH_ERR_INVALID, "stash policy: a closed epoch has no event");
  }
  stash_status_t st = _STASH_PCALL(h, stream_wait, h->device, s->streams[slot].stream, ev);
  if (st != STASH_OK) return _stash_prov_fail(h, st, "make a stream wait for an event");
  h->stats.num_stream_waits++;
  return STASH_OK;
}

/* The free block of arena a that stream slot `slot` would take, in the memory other streams
 * have freed and may still be using (tagged with their slots): in the large arena, the first
 * other stream's block that turn replay's fallback would take (clear of where the allocations
 * of the turn went one turn earlier), else its best fit (its free end last); in the small
 * arena, the best fit of all. NULL if none fits. Called where no block any stream may use
 * fits, so that only the other streams' own blocks are found. */
static sb_block* others_fit(sb_state* s, sb_arena* a, size_t size, uint32_t slot) {
  sb_block* best = NULL;
  for (size_t k = 1; k <= s->nstreams; k++) {
    if (k == slot || !s->streams[k].thead) continue;
    sb_block* b = a->small ? NULL : clear_fit(s, a, size, (uint32_t)k);
    if (!b) b = best_fit(a, size, (uint32_t)k);
    if (b && !a->small) return b;
    if (b && (!best || cmp_size(&b->snode, &best->snode) < 0)) best = b;
  }
  return best;
}

/* Where no free block fits a request of stream slot `slot` but one another stream freed, whose
 * epoch is not known to be over (stream_waits, stash.h): that block (others_fit), slot's
 * stream made to wait for its owner's work (wait_for_owner). *out: the block, or NULL where
 * there is none or the heap may not wait. On 405 traces given a side stream
 * (tools/side_streams.py), with one request of any size every 2000 events, issue 4's targets
 * hold on 332 with it and 265 without; from event 2000 on, 330 and 236 (docs/policy-stash.md,
 * "Forty-seventh session"). A large request tries it before memory empty_cache gave back and
 * before stitching (driver calls both); a small one only before the small arena grows, after
 * the large arena's free memory. */
static stash_status_t waited_fit(stash_heap_t* h, sb_arena* a, size_t size, uint32_t slot,
                                 sb_block** out) {
  sb_state* s = S(h);
  *out = NULL;
  if (!may_wait(h)) return STASH_OK;
  sb_block* b = others_fit(s, a, size, slot);
  if (!b) return STASH_OK;
  stash_status_t st = wait_for_owner(h, slot, b->tag);
  if (st != STASH_OK) return st;
  *out = b;
  return STASH_OK;
}

/* One placement of a request by the rules above; `pressed`: the device could not serve it as
 * they place it (sb_alloc's retry). */
static stash_status_t try_alloc(stash_heap_t* h, size_t size, uint32_t slot, bool pressed,
                                stash_fate_class_t fate, sb_block** out) {
  sb_state* s = S(h);
  sb_arena* a = &s->arenas[size <= kSmallLimit ? 0 : 1];
  sb_block* hinted = NULL; /* turn replay's place, free but another stream's ... */
  uint64_t hinted_at = 0;   /* ... and its address */
  if (!a->small) {
    stash_status_t st = STASH_OK;
    sb_block* r = replay(h, a, size, slot, &st, &hinted, &hinted_at);
    if (st != STASH_OK) return st;
    if (r) {
      r->kind = K_USER;
      *out = r;
      return STASH_OK;
    }
  }
  sb_block* b = NULL;
  if (kUseFates != 1) fate = STASH_FATE_UNKNOWN;
  if (!a->small && fate == STASH_FATE_AROUND_HUGE) {
    /* Its counterpart was freed around the last step's huge requests (the logits): at the top
     * of the highest free block that holds it, where the blocks freed with it gather and
     * their memory meets the arena's free end when the huge requests come (fate.c). */
    sb_block* fb = highest_fit(a, size, slot);
    if (fb) {
      stash_status_t st = STASH_OK;
      sb_block* r = take_at(h, a, fb, fb->ptr + fb->size - size, size, &st);
      if (!r) return st;
      r->kind = K_USER;
      *out = r;
      return STASH_OK;
    }
  }
  /* Its counterpart lived past them: the lowest fitting block, below those. */
  if (!a->small && fate == STASH_FATE_STAYS) b = first_fit(a, size, slot);
  if (!a->small && !b) {
    if (kUseClearFit == 1) b = clear_fit(s, a, size, slot);
    if (!b && kFirstFitAll != 1) b = first_fit(a, size, slot);
    /* while little is live (between training steps, optimizer state being made), long-lived
     * blocks pack at the arena's start */
    if (!b && kUseQuiet == 1 && s->live_peak >= (int64_t)kPhaseMinPeak &&
        h->stats.allocated_bytes[STASH_STAT_ALL].current * kQuietShare < s->live_peak)
      b = first_fit(a, size, slot);
  }
  if (a->small && a->nranged) b = ranged_fit(h, a, size, slot);
  if (!b) b = best_fit(a, size, slot);
  if (hinted && b && _stash_sb_arena_unready(h, a, b->ptr, size)) {
    /* the block found lies on memory not yet mapped there (made for a stitched range): turn
     * replay's place, waiting for the work of the stream that freed it, costs no driver call */
    stash_status_t r = wait_for_owner(h, slot, hinted->tag);
    if (r != STASH_OK) return r;
    sb_block* t = take_at(h, a, hinted, hinted_at, size, &r);
    if (!t) return r;
    t->kind = K_USER;
    *out = t;
    return STASH_OK;
  }
  if (!b && !a->small) { /* another stream's freed block, waiting for its work there */
    stash_status_t r = waited_fit(h, a, size, slot, &b);
    if (r != STASH_OK) return r;
  }
  /* what empty_cache gave back comes back before new memory - when tight, in the large arena,
   * only once its address range has no room left at its end (new memory comes in pieces) */
  if (!b && a->nreleased &&
      (a->small || !s->tight || a->mapped + round_up(size, G) > a->va_size)) {
    stash_status_t r = _stash_sb_arena_take_back(h, a, size, slot);
    if (r != STASH_OK && r != STASH_ERR_OOM) return r;
    b = best_fit(a, size, slot);
  }
  /* Under kStitchCoverMin: only from whole free allocations that cover it (with new memory
   * too, such ranges were remade turn after turn: driver calls in the steady state), and not
   * while tight or pressed (at the device's limit it needed larger devices as often as smaller:
   * docs/policy-stash.md, "Thirty-first session"). */
  bool below_cover_min = size < kStitchCoverMin;
  if (!b && !a->small && (!below_cover_min || (!s->tight && !pressed))) {
    sb_block* ub = block_new(s);
    if (!ub) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    sb_stitch* st = NULL;
    bool cover_only = below_cover_min ||
                      (size < kStitchMin && !mid_sized_may_grow_a_range(s, size) && !pressed);
    stash_status_t r = _stash_sb_stitch_alloc(h, size, slot, cover_only, pressed, &st);
    if (r != STASH_OK || !st) block_delete(s, ub);
    if (r != STASH_OK) return r;
    if (!st) goto grow;
    ub->kind = K_USER;
    range_user(st, ub, size);
    *out = ub;
    return STASH_OK;
  }
grow:
  if (!b && a->small) {
    /* A small request that the small arena cannot fit takes the large arena's best fit
     * before the small arena grows: memory the large requests have left free serves it
     * without a driver call (and without a growth in a training loop's steady state). */
    sb_arena* large = &s->arenas[1];
    if (large->nranged) b = ranged_fit(h, large, size, slot);
    if (!b) b = best_fit(large, size, slot);
    if (b) a = large;
    if (!b && s->ncached) { /* merge the cached blocks before growing */
      cache_flush(s);
      b = best_fit(a, size, slot);
    }
    /* another stream's freed block, waiting for its work there: the last resort before the
     * small arena grows */
    for (int i = 0; i < 2 && !b; i++) {
      stash_status_t r = waited_fit(h, &s->arenas[i], size, slot, &b);
      if (r != STASH_OK) return r;
      if (b) a = &s->arenas[i];
    }
  }
  if (!b) {
    size_t tail = free_tail(a, slot);
    stash_status_t r = _stash_sb_arena_grow(h, a, (size - tail + G - 1) / G, slot, false,
                                            a->small ? SIZE_MAX : large_piece(h, size), false);
    if (r != STASH_OK) return r;
    b = best_fit(a, size, slot);
    if (!b) return _stash_error(STASH_ERR_INVALID, "stash policy: grown arena does not fit");
  }
  if (!a->small) {
    stash_status_t r = arena_ready(h, a, b->ptr, size);
    if (r != STASH_OK) return r;
  }
  sb_block* post = NULL; /* the rest of b, if any: split off its front */
  if (size < b->size && !(post = spare_new(s)))
    return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  *out = carve(s, b, b->ptr, size, NULL, post);
  (*out)->kind = K_USER;
  return STASH_OK;
}

/* Whether the heap holds kTightPct percent or more of what it may hold: the device's memory,
 * or less under a memory fraction. */
static bool nearly_full(const stash_heap_t* h) {
  size_t may = h->has_limit && h->allowed_max < h->device_total ? h->allowed_max
                                                                  : h->device_total;
  return (double)h->total_reserved * 100.0 >= (double)kTightPct * (double)may;
}

static size_t largest_free(sb_state* s) {
  size_t best = 0;
  for (int i = 0; i < 2; i++) {
    for (size_t k = 0; k <= s->nstreams; k++) {
      if (!s->arenas[i].by_size) break;
      bs_node_t* n = _stash_bs_last(&s->arenas[i].by_size[k]);
      if (n && FROM_SNODE(n)->size > best) best = FROM_SNODE(n)->size;
    }
  }
  return best;
}

/* Before stream `slot` allocates: process the events that have completed, in few queries.
 * The lead stream's own epochs wait while it asks and fewer than kLazyEpochs more of them
 * are queued than its queue held after its last poll (lead_lag: 0 where the GPU keeps up):
 * their end frees its blocks for the other streams only - to the lead, a block
 * tagged with its slot is as good as one any stream may use (best fit looks at both sets,
 * and tags_merge merges the two) - and every other stream's request polls every queue first.
 * Events that frees with record_stream's uses wait for are polled at once. The same
 * decisions (every address alike: bench_replay --digest), fewer driver calls: on tools/
 * side_streams.py's `any` set, twelfth/gpt2_b17 made 648 queries (123 us modelled) and makes
 * 99 (19 us); the sets' traces meeting all three targets: first 361 -> 363, small 353 -> 354,
 * any 343 -> 344, late 341 -> 342, no peak moved (forty-ninth session). */
#define kLazyEpochs 16
static stash_status_t poll_events(stash_heap_t* h, uint32_t slot) {
  sb_state* s = S(h);
  void* lead = s->streams[s->lead].stream;
  stash_ev_poll_t how = {.skip = lead,
                         .has_skip = slot == s->lead && !s->pending_uses,
                         .skip_below = s->lead_lag + kLazyEpochs};
  bool asked = !how.has_skip || _stash_events_queued(&s->events, lead) >= how.skip_below;
  stash_status_t st = _stash_events_poll_fewer(h, &s->events, &how, event_done);
  /* A GPU behind the host leaves the lead's head event incomplete: its queue is asked again
   * once kLazyEpochs more are queued, not at every request (one query, 0.19 us, where the
   * fast path takes tens of ns). Where the GPU keeps up, the lag is 0. */
  if (asked && s->lead) s->lead_lag = _stash_events_queued(&s->events, lead);
  return st;
}

static stash_status_t sb_alloc(stash_heap_t* h, size_t orig, void* stream, uint64_t* out) {
  sb_state* s = S(h);
  knob_arm(s);
  if (_stash_ptrmap_room(&s->allocated, 1) != STASH_OK)
    return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  uint32_t slot = 0;
  stash_status_t st = stream_slot(h, stream, &slot);
  if (st != STASH_OK) return st;
  st = poll_events(h, slot);
  if (st != STASH_OK) return st;
  st = close_epochs(h, slot);
  if (st != STASH_OK) return st;
  size_t size = orig < kMinBlock ? kMinBlock : round_up(orig, kMinBlock);
  /* More than the device (or the heap's memory fraction) holds: nothing released from the
   * cache can make room for it, so the cache stays, and no range is planned for it (its page
   * list alone would be host memory for nothing: 400 GB for a request of 200 PB). */
  if (size > h->device_total || (h->has_limit && size > h->allowed_max))
    return _stash_report_oom(h, orig, stream, NULL, largest_free(s), NULL);
  sb_block* b = NULL;
  s->nallocs++;
  s->streams[slot].last_alloc = s->nallocs;
  uint64_t lead_n = s->streams[s->lead].nallocs;
  if (++s->streams[slot].nallocs > lead_n + lead_n / 8 && slot != s->lead)
    lead_change(s, slot); /* an eighth more: two streams alike do not swap at every turn */
  if (size <= kSmallLimit && s->ncached) { /* the fast path: a cached block of this size */
    sb_block** head = &s->cache[size / kMinBlock - 1];
    if (*head && cached_ok(s, *head, slot)) {
      b = *head;
      *head = b->tnext;
      s->ncached--;
      s->cached_bytes -= b->size;
      b->tnext = NULL;
      b->kind = K_USER;
      b->tag = 0;
      b->epoch = 0;
      goto got;
    }
  }
  int64_t live = h->stats.allocated_bytes[STASH_STAT_ALL].current;
  if (live == 0) { /* everything was freed (a model deleted): the phases start afresh */
    s->live_peak = 0;
    s->dropped = false;
    s->tight = false; /* the next run's first drop decides again */
    s->freed = false;
    s->largest = 0;
    s->grown_to_peak = false;
    s->arenas[1].last_grow_pages = 0; /* and no burst continues the old one */
  }
  if (live > s->live_peak) s->live_peak = live;
  bool first_drop =
      !s->dropped && s->live_peak >= (int64_t)kPhaseMinPeak && 2 * live < s->live_peak;
  if (first_drop) s->dropped = true;
  if (size > s->largest) s->largest = size;
  /* Nearly full at the first drop, or at a large request after it (a second step that holds
   * more: an optimizer's state, a longer sequence), with no setting: tight from here on. At
   * the first drop what lies wholly free goes back too, so the next step grows in pieces (a
   * failure leaves it held, and consistent) - but not from a free block that holds the
   * largest request so far: the next step's counterpart of that request finds it whole
   * (twelfth/vgg13_b48, whose own peak fills 98% of its device, completes there so); later
   * the cache is kept - given back in mid-step, the memory would only be asked for again
   * (measured: README, "At the device's limit"). */
  if ((first_drop || (s->dropped && size > kSmallLimit)) && !s->tight && !piece_limit(h) &&
      nearly_full(h)) {
    s->tight = true;
    if (first_drop && !h->capturing) (void)release_cache_keep(h, s->largest);
  }
  /* what this request's counterpart did a step earlier (fate.c) */
  stash_fate_class_t fate = STASH_FATE_UNKNOWN;
  if (size > kSmallLimit) {
    fate = _stash_fate_predict(&s->fate, _stash_loop_context(&s->loop), size, live);
    /* The second step of a run whose logits are huge only for it holds more than the first
     * (the optimizer's state) and would grow as it goes, new memory coming above the blocks
     * placed at the top and at the bottom alike: grow the large arena at once to what it is
     * predicted to hold, so that its blocks fit apart (docs/policy-stash.md, "Fates while the
     * arena grows"). */
    int64_t grow_to = _stash_fate_take_growth(&s->fate);
    if (grow_to > (int64_t)h->total_reserved && !s->tight &&
        !piece_limit(h)) {
      size_t pages = ((size_t)grow_to - h->total_reserved + G - 1) / G;
      st = _stash_sb_arena_grow(h, &s->arenas[1], pages, slot, true, kLargePieceMax, false);
      if (st != STASH_OK && st != STASH_ERR_OOM) return st;
      if (st == STASH_OK) s->grown_to_peak = true;
    }
  } else {
    _stash_fate_live(&s->fate, live);
  }
  st = try_alloc(h, size, slot, false, fate, &b);
  if (st == STASH_ERR_OOM) {
    /* The device is full: a request that may be stitched is, from every whole free
     * allocation and the best edges, with new memory only for the rest, whatever share of
     * it they give (pressed); then, if that does not fit either, with the cache released -
     * not during a CUDA graph capture. */
    if (size >= kStitchCoverMin) st = try_alloc(h, size, slot, true, fate, &b);
    if (st == STASH_ERR_OOM && !h->capturing) {
      h->stats.num_alloc_retries++; /* as PyTorch counts them: a cache flush and a retry */
      st = release_cache(h);
      if (st == STASH_OK) st = try_alloc(h, size, slot, true, fate, &b);
    }
  }
  if (size > kSmallLimit) s->recent[s->nrecent++ % kRecentSizes] = size;
  if (st == STASH_ERR_OOM) {
    /* Memory held free that no request of this size could use: smaller pieces would let a
     * stitched range map more of it (README, "At the device's limit") - unless the setting
     * is made already. A heap turned tight makes small pieces only from then on; what the
     * setting adds is small pieces from the start (twelfth/vgg13_b48 on 3690 MiB: out of
     * memory, turned tight; with the setting it completes). */
    int64_t unused = h->stats.reserved_bytes[STASH_STAT_ALL].current -
                     h->stats.allocated_bytes[STASH_STAT_ALL].current;
    bool advise = !h->conf.max_piece_size && unused >= (int64_t)G;
    return _stash_report_oom(h, orig, stream, NULL, largest_free(s),
                             advise ? "The memory reserved but unallocated lies in physical "
                                      "allocations that live blocks share; at the device's "
                                      "limit, STASH_CONF max_piece_size_mb:20 makes every one "
                                      "of them 20 MiB at most from the start, so that more of "
                                      "it can serve a request."
                                    : NULL);
  }
  if (st != STASH_OK) return st;
  if (!block_small(b)) { /* a large block: tell fate.c and the loop detector */
    b->fated = _stash_fate_alloc(&s->fate, &b->fate_key, &b->fate_step);
    b->loop_id = _stash_loop_alloc(&s->loop, b->size,
                                   b->stitch ? STASH_LOOP_ELSEWHERE | b->stitch->id
                                             : b->ptr - b->arena->base);
  }
got:
  b->requested = orig;
  b->stream = stream;
  b->allocated = true;
  bool small = block_small(b);
  stat_inc(h->stats.allocation, small, 1);
  stat_inc(h->stats.allocated_bytes, small, b->size);
  stat_inc(h->stats.active, small, 1);
  stat_inc(h->stats.active_bytes, small, b->size);
  stat_inc(h->stats.requested_bytes, small, orig);
  _stash_ptrmap_put(&s->allocated, b->ptr, b); /* room reserved above */
  _stash_history_add(h, STASH_TRACE_ALLOC, b->ptr, orig, stream);
  *out = b->ptr;
  return STASH_OK;
}

/* A freed block's uses are over: its memory goes back to the arena (or the stitched range
 * is free again), tagged with its stream until that stream's next epoch completes. */
static void user_free_complete(stash_heap_t* h, sb_block* b) {
  sb_state* s = S(h);
  bool small = block_small(b);
  _stash_history_add(h, STASH_TRACE_FREE_COMPLETED, b->ptr, b->requested, b->stream);
  stat_dec(h->stats.active, small, 1);
  stat_dec(h->stats.active_bytes, small, b->size);
  stat_dec(h->stats.requested_bytes, small, b->requested);
  uint32_t slot = slot_of(s, b->stream);
  sb_stream* sst = &s->streams[slot];
  uint64_t epoch = sst->epoch_next;
  sst->dirty = true;
  if (b->stitch) {
    sb_stitch* st = b->stitch;
    st->user = NULL;
    _stash_sb_stitch_return(h, st, slot, epoch);
    block_delete(s, b);
    return;
  }
  b->allocated = false;
  b->requested = 0;
  b->tag = slot;
  b->epoch = epoch;
  if (b->uses) { /* record_stream's other streams */
    free(b->uses);
    b->uses = NULL;
    b->nuses = b->cap_uses = 0;
  }
  if (b->arena->small && s->cached_bytes + b->size <= kCacheMaxBytes &&
      !ranged_at(h, b->arena, b->ptr, b->size)) {
    /* kept for the next request of its size (not on a page a stitched range maps: the range
     * needs it free) */
    sb_block** head = &s->cache[b->size / kMinBlock - 1];
    b->kind = K_CACHED;
    b->tnext = *head;
    *head = b;
    s->ncached++;
    s->cached_bytes += b->size;
    return;
  }
  b->kind = K_FREE;
  free_coalesce(s, b);
}

static stash_status_t sb_free(stash_heap_t* h, uint64_t ptr) {
  sb_state* s = S(h);
  sb_block* b = _stash_ptrmap_take(&s->allocated, ptr); /* one lookup: put back on failure */
  if (!b)
    return _stash_error(STASH_ERR_BAD_POINTER,
                        "free: 0x%" PRIx64 " is not a live allocation of this heap (never "
                        "allocated here, already freed, or not the start of a block)",
                        ptr);
  if (s->nstreams >= 2) { /* its stream's epoch, every kFreeEpoch frees (close_epochs) */
    uint32_t k = slot_of(s, b->stream); /* never 0: its stream allocated it here */
    sb_stream* fs = &s->streams[k];
    if (fs->dirty && ++fs->frees >= (uint32_t)kFreeEpoch && others_active(s, k)) {
      stash_status_t st = epoch_close(h, k);
      if (st != STASH_OK) {
        fs->frees--;
        (void)_stash_ptrmap_put(&s->allocated, ptr, b); /* cannot fail: its slot was just freed */
        return st;
      }
    }
  }
  if (b->nuses) {
    stash_status_t st = _stash_events_record(h, &s->events, b->uses, b->nuses, b);
    if (st != STASH_OK) {
      (void)_stash_ptrmap_put(&s->allocated, ptr, b); /* cannot fail: its slot was just freed */
      return st;
    }
    if (b->event_count == 0) s->pending_uses++;
    b->event_count += (int)b->nuses;
    b->nuses = 0;
  }
  s->freed = true;
  s->allocs_at_free = s->nallocs;
  _stash_history_add(h, STASH_TRACE_FREE_REQUESTED, b->ptr, b->requested, b->stream);
  b->allocated = false;
  bool small = block_small(b);
  stat_dec(h->stats.allocation, small, 1);
  stat_dec(h->stats.allocated_bytes, small, b->size);
  if (!small) {
    _stash_loop_freed(&s->loop, b->loop_id, b->size);
    if (b->fated) _stash_fate_freed(&s->fate, b->fate_key, b->fate_step);
  }
  if (b->event_count == 0) user_free_complete(h, b);
  return STASH_OK;
}

static stash_status_t sb_record_stream(stash_heap_t* h, uint64_t ptr, void* stream) {
  sb_block* b = _stash_ptrmap_get(&S(h)->allocated, ptr);
  if (!b)
    return _stash_error(STASH_ERR_BAD_POINTER,
                        "record_stream: 0x%" PRIx64 " is not a live allocation of this heap",
                        ptr);
  if (stream == b->stream) return STASH_OK;
  return _stash_uses_add(&b->uses, &b->nuses, &b->cap_uses, stream);
}

/* Wait for pending frees, unmap free stitched ranges, give back the free ends of arenas and
 * the wholly free allocations between live blocks - except, in the large arena, those in a free
 * block of keep_from bytes or more (release_cache: none kept). */
static stash_status_t release_cache_keep(stash_heap_t* h, size_t keep_from) {
  sb_state* s = S(h);
  h->stats.num_sync_all_streams++;
  stash_status_t st = _stash_events_poll(h, &s->events, true, event_done);
  if (st != STASH_OK) return st;
  cache_flush(s); /* after the poll: a free whose events completed there may be cached */
  /* Blocks still tagged were freed on their stream after its last completed epoch: wait
   * for that stream (unmapping does not wait for the GPU), then they are free for all. */
  stash_status_t first = STASH_OK;
  for (size_t k = 1; k <= s->nstreams; k++) {
    if (!s->streams[k].thead) continue;
    stash_status_t r = PCALL(h, stream_synchronize, h->device, s->streams[k].stream);
    if (r != STASH_OK) {
      if (first == STASH_OK) first = prov_fail(h, r, "synchronize a stream");
      continue; /* its blocks stay tagged, and so in use by that stream only */
    }
    /* every block it freed so far is free for all; those it frees from now on wait for an
     * event again (the stream's epoch_done must stay below its epoch_next: at 2^40 - 1, as
     * it was set here before the forty-seventh session, every small block the stream freed
     * after an empty_cache went to other streams' requests at once, its work unfinished) */
    epoch_done(h, (uint32_t)k, s->streams[k].epoch_next);
    epoch_advance(&s->streams[k]);
  }
  for (sb_stitch* x = s->stitches; x;) {
    sb_stitch* next = x->next_st;
    if (!x->user) {
      stash_status_t r = _stash_sb_stitch_release(h, x);
      if (r != STASH_OK && first == STASH_OK) first = r;
    }
    x = next;
  }
  for (int i = 0; i < 2; i++) {
    stash_status_t r = _stash_sb_arena_revive(h, &s->arenas[i]);
    if (r != STASH_OK && first == STASH_OK) first = r;
    r = _stash_sb_arena_shrink(h, &s->arenas[i]);
    if (r != STASH_OK && first == STASH_OK) first = r;
    r = _stash_sb_arena_give_back(h, &s->arenas[i], i ? keep_from : SIZE_MAX);
    if (r != STASH_OK && first == STASH_OK) first = r;
  }
  stash_status_t r = _stash_zombies_release(h, &S(h)->zombies);
  if (r != STASH_OK && first == STASH_OK) first = r;
  return first;
}

static stash_status_t release_cache(stash_heap_t* h) { return release_cache_keep(h, SIZE_MAX); }

static stash_status_t sb_empty_cache(stash_heap_t* h) { return release_cache(h); }

/* ---- Lifetime ----------------------------------------------------------------------------- */

static stash_status_t sb_create(stash_heap_t* h) {
  sb_state* s = calloc(1, sizeof *s);
  if (!s) return _stash_error(STASH_ERR_HOST_OOM, "stash_heap_create: out of host memory");
  s->cap_streams = 4;
  s->streams = calloc(s->cap_streams, sizeof *s->streams);
  for (int i = 0; i < 2; i++) {
    s->arenas[i].small = i == 0;
    s->arenas[i].grow_bytes = i == 0 ? kSmallGrowBytes : kLargeGrowBytes;
    _stash_bs_init_keys(&s->arenas[i].by_addr, cmp_addr, 1, ANODE_KEY(ptr), 0, 0);
    s->arenas[i].by_size = malloc(s->cap_streams * sizeof(blockset_t));
  }
  if (!s->streams || !s->arenas[0].by_size || !s->arenas[1].by_size) {
    free(s->streams);
    free(s->arenas[0].by_size);
    free(s->arenas[1].by_size);
    free(s);
    return _stash_error(STASH_ERR_HOST_OOM, "stash_heap_create: out of host memory");
  }
  for (int i = 0; i < 2; i++)
    for (size_t k = 0; k < s->cap_streams; k++) by_size_init(&s->arenas[i].by_size[k]);
  _stash_slab_init(&s->block_slab, sizeof(sb_block));
  _stash_ptrmap_init(&s->allocated);
  _stash_loop_init(&s->loop);
  _stash_fate_init(&s->fate);
  h->policy_state = s;
  return STASH_OK;
}

static stash_status_t sb_destroy(stash_heap_t* h) {
  sb_state* s = S(h);
  stash_status_t first = STASH_OK;
#define KEEP(x) _STASH_KEEP_FIRST(first, x)
  KEEP(_stash_events_destroy(h, &s->events));
  KEEP(_stash_zombies_release(h, &S(h)->zombies));
  _stash_zombies_free(&s->zombies);
  for (sb_stitch* x = s->stitches; x;) {
    sb_stitch* next = x->next_st;
    KEEP(PCALL(h, unmap, h->device, x->va, x->npages * G));
    free(x->homes);
    free(x);
    x = next;
  }
  for (int i = 0; i < 2; i++) {
    sb_arena* a = &s->arenas[i];
    for (size_t k = 0; k < a->nhandles;) { /* the mapped runs of allocations */
      size_t j = k;
      while (j < a->nhandles && a->handles[j].access != H_UNMAPPED &&
             a->handles[j].access != H_RELEASED)
        j++;
      if (j > k) {
        uint64_t from = a->base + a->handles[k].first_page * G;
        uint64_t to = a->base + (a->handles[j - 1].first_page + a->handles[j - 1].npages) * G;
        KEEP(PCALL(h, unmap, h->device, from, to - from));
      }
      k = j < a->nhandles ? j + 1 : j;
    }
    for (size_t k = 0; k < a->nhandles; k++)
      if (a->handles[k].access != H_RELEASED)
        KEEP(PCALL(h, phys_release, h->device, a->handles[k].handle));
    free(a->handles);
    free(a->by_size);
  }
  for (size_t i = 0; i < s->nva_ranges; i += 2)
    KEEP(PCALL(h, va_free, h->device, s->va_ranges[i], s->va_ranges[i + 1]));
#undef KEEP
  if (first != STASH_OK) first = prov_fail(h, first, "give memory back while destroying the heap");
  for (int i = 0; i < 2; i++) {
    for (sb_block* b = s->arenas[i].first; b; b = b->next) free(b->uses);
  }
  free(s->va_ranges);
  free(s->streams);
  for (int i = 0; i < 2; i++) free(s->arenas[i].ranged);
  _stash_loop_free(&s->loop);
  _stash_fate_free(&s->fate);
  _stash_ptrmap_free(&s->allocated);
  _stash_slab_destroy(&s->block_slab);
  free(s);
  h->policy_state = NULL;
  return first;
}

const stash_policy_ops_t _stash_policy_stash = {
    .name = "stash",
    .create = sb_create,
    .destroy = sb_destroy,
    .alloc = sb_alloc,
    .free = sb_free,
    .record_stream = sb_record_stream,
    .empty_cache = sb_empty_cache,
    .visit = _stash_sb_visit,
    .check = _stash_sb_check,
};
