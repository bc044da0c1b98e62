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
 * completed (a "tag" and an epoch per stream; no event at all with one stream). With one
 * stream, up to 1 MiB of freed small blocks wait, unmerged, for a request of exactly their
 * size: the fast path (K_CACHED below).
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
 * then plain best fit (or stitching) - so the layout, once it repeats, keeps repeating. Not
 * with more than one stream.
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
 * placed as before. Not with more than one stream.
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
 * Synchronization: every function here runs under the heap's lock (heap.c).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The policy's constants. An experiment build (cmake -DSTASH_POLICY_KNOBS=ON) reads each
 * KNOB_ one from the environment instead, STASH_KNOB_<name>=<positive integer>, whenever it is
 * used: tools/compare_policies.py measures a change of one against every recorded trace. A
 * value that is not a positive integer stops the process there (an experiment must not run
 * on a setting it did not ask for). Other builds compile the constants in. */
#ifdef STASH_POLICY_KNOBS
static long long knob(const char* name, long long value) {
  char key[64];
  snprintf(key, sizeof key, "STASH_KNOB_%s", name);
  const char* v = getenv(key);
  if (!v) return value;
  char* end = NULL;
  long long x = strtoll(v, &end, 0);
  if (!*v || *end || x <= 0) {
    fprintf(stderr, "%s=%s: not a positive integer\n", key, v);
    abort();
  }
  return x;
}
#define KNOB_Z(name, value) ((size_t)knob(#name, (long long)(value)))
#define KNOB_I(name, value) ((int)knob(#name, (value)))
#else
#define KNOB_Z(name, value) (value)
#define KNOB_I(name, value) (value)
#endif

#define kMinBlock ((size_t)512)
#define kSmallLimit ((size_t)1 << 20) /* requests up to this go to the small arena */
/* The small arena grows by at least kSmallGrowBytes or, soon after its last growth, by twice
 * that one, up to kSmallBurstMax. */
#define kSmallGrowBytes KNOB_Z(kSmallGrowBytes, (size_t)2 << 20)
#define kSmallBurstMax KNOB_Z(kSmallBurstMax, (size_t)8 << 20)
/* The large arena grows by at least kLargeGrowBytes - but, once live bytes have first fallen
 * to half their peak (in a heap not turned tight), by just what a request lacks when the block
 * it grows for (the free end it extends and the new pages) is kExactGrowFrom or more - in
 * physical allocations of at most
 * kLargePieceMax (fewer pieces cost fewer cuMemSetAccess calls; smaller ones are more often
 * wholly free, for stitching), or of 1/kLargePieces of a request over kLargePieces times
 * kLargePieceMax (1.875 GiB): a huge logits tensor in 10 pieces, not one per 192 MiB - and
 * of 1/kHugePieces of a request of kHugeFrom (3.5 GiB) or more, whose access call costs
 * mostly by the MiB by then - but a
 * request of at most kOnePiecePct percent of kLargePieceMax whose size was among the last
 * kRecentSizes large requests (a layer's tensor, seen before) grows in one piece, not as
 * 192 MiB and a runt. A growth kBurstAllocs or fewer allocations after the last doubles the
 * last one's size, up to kBurstMax (until live bytes first fall to half their peak); while
 * nothing has been freed yet (a model being loaded), every growth doubles the last, up to
 * kLargePieceMax; after the first drop, a growth kRunAllocs or more allocations after the last
 * free (a run that frees nothing: state being made) doubles the last, up to kBurstMax (not
 * in a heap turned tight: at the device's limit it moved mobilenet_v2_b256's smallest device
 * 4 MiB over expandable segments'). No burst, and the burst chain left as it was, when the
 * arena holds at least kBurstMax free bytes and kScatterTimes the request's more than when the
 * last growth was asked for (the free memory is scattered: a burst's end would lie unused at
 * the peak). */
#define kLargeGrowBytes KNOB_Z(kLargeGrowBytes, (size_t)6 << 20)
#define kExactGrowFrom KNOB_Z(kExactGrowFrom, (size_t)12 << 20)
#define kLargePieceMax KNOB_Z(kLargePieceMax, (size_t)192 << 20)
#define kLargePieces KNOB_I(kLargePieces, 10)
#define kBurstAllocs KNOB_Z(kBurstAllocs, (size_t)20)
#define kRunAllocs KNOB_Z(kRunAllocs, (size_t)32)
#define kBurstMax KNOB_Z(kBurstMax, (size_t)64 << 20)
#define kScatterTimes KNOB_Z(kScatterTimes, (size_t)2)
#define kOnePiecePct KNOB_Z(kOnePiecePct, (size_t)400)
#define kHugeFrom KNOB_Z(kHugeFrom, (size_t)7 << 29)
#define kHugePieces KNOB_I(kHugePieces, 5)
#define kRecentSizes 64
/* A heap holding kTightPct percent of what it may hold at the first drop, or at a large
 * request after it, turns tight: large physical allocations of at most kTightPiece from then
 * on (README, "At the device's limit"). */
#define kTightPct KNOB_I(kTightPct, 90)
#define kTightPiece KNOB_Z(kTightPiece, (size_t)20 << 20)
/* Live-byte phases count from a peak of kPhaseMinPeak: below 1/kQuietShare of the peak, first
 * fit, comparing at most kFirstFitTries fitting free blocks. */
#define kPhaseMinPeak KNOB_Z(kPhaseMinPeak, (size_t)256 << 20)
#define kQuietShare KNOB_I(kQuietShare, 4)
#define kFirstFitTries KNOB_I(kFirstFitTries, 256)
/* Requests of kStitchMin or more may be stitched when holes give at least 1/kStitchHoleShare
 * of them in whole allocations, or with the best head and tail at least half (before the
 * first drop, or tight) or 1/kStitchEdgeShare less a page (after it) - but while live bytes
 * are at their peak so far before the first drop (a first pass climbing), kClimbPct percent:
 * the free memory a climb leaves beside its live blocks is what its next requests take, so a
 * range there saves nothing at the peak and costs its pieces' access calls (docs/policy-
 * stash.md, "Thirtieth session"); smaller ones from kStitchCoverMin too between the first
 * drop and a repeating turn, and otherwise only when whole free allocations cover them (no
 * new memory) - as any large request under kStitchCoverMin may be (docs/policy-stash.md,
 * "Thirty-first session").
 * A range for a request under kStitchEdgeMin has a head or a tail in a hole only of
 * kStitchSmallEdge or more, and none while a free cached range would hold the request (under
 * pressure, any).
 * New memory for a stitched range: one allocation of at most kStitchPiece, or of
 * 1/kStitchPieces of a request above 64 GiB. Holes smaller than kStitchMinRun hold no whole
 * allocation, and a head or tail gives at least that. */
#define kStitchMin KNOB_Z(kStitchMin, (size_t)128 << 20)
#define kClimbPct KNOB_Z(kClimbPct, (size_t)75)
#define kStitchHoleShare KNOB_I(kStitchHoleShare, 10)
#define kStitchEdgeShare KNOB_I(kStitchEdgeShare, 20)
#define kStitchCoverMin KNOB_Z(kStitchCoverMin, (size_t)48 << 20)
#define kStitchEdgeMin KNOB_Z(kStitchEdgeMin, (size_t)64 << 20)
#define kStitchSmallEdge KNOB_Z(kStitchSmallEdge, (size_t)8 << 20)
#define kStitchPiece KNOB_Z(kStitchPiece, (size_t)1 << 30)
#define kStitchPieces KNOB_I(kStitchPieces, 64)
#define kStitchMinRun KNOB_Z(kStitchMinRun, (size_t)2 << 20)
/* Turn replay's fallback: at most kForecastMax allocations foreseen, and kClearFitTries
 * fitting free blocks tried. */
#define kForecastMax 512
#define kClearFitTries KNOB_I(kClearFitTries, 64)

typedef struct sb_block_s sb_block;
typedef struct sb_arena_s sb_arena;
typedef struct sb_stitch_s sb_stitch;

/* K_DEAD: mapped memory the driver refused access to (set_access failed and the mapping
 * could not be undone): held, never handed out, retried by empty_cache.
 * K_CACHED: a freed block of the small arena kept out of the free sets for the next request
 * of exactly its size (the fast path: no search, no split, no merge), up to 1 MiB in all;
 * merged into the arena ("flushed") before the small arena would grow, by empty_cache, and
 * for good once a second stream appears (only a single stream's blocks are cached). */
/* K_VOID: a physical allocation of the arena that empty_cache gave back while blocks lived
 * on both sides of it: its addresses stay the arena's, with no memory behind them, out of the
 * free sets until the arena needs memory again (arena_take_back). */
enum { K_FREE = 0, K_USER = 1, K_PHANTOM = 2, K_DEAD = 3, K_CACHED = 4, K_VOID = 5 };
#define kCacheSizes (kSmallLimit / kMinBlock) /* the small arena's 2048 block sizes */
/* cached at most; more would hide free memory from best fit and grow the small arena */
#define kCacheMaxBytes KNOB_Z(kCacheMaxBytes, (size_t)1 << 20)


struct sb_block_s {
  bs_node_t snode;    /* free: in arena->by_size[tag], by (size, address) */
  bs_node_t anode;    /* free: in arena->by_addr */
  uint64_t ptr;
  size_t size;
  size_t requested;   /* user: bytes asked for */
  void* stream;       /* user: allocation stream */
  sb_arena* arena;    /* NULL for a stitched user block */
  sb_stitch* stitch;  /* stitched user block, or phantom: the range it serves */
  sb_block* prev;     /* arena blocks: address neighbours */
  sb_block* next;
  sb_block* tprev;    /* free, tagged: the stream's list of its tagged blocks */
  sb_block* tnext;
  void** uses;        /* user: other streams it was used on */
  uint32_t nuses, cap_uses;
  int event_count;    /* user, freed: events still to complete */
  uint64_t loop_id;   /* large user block: its event in the loop detector */
  uint64_t fate_key;  /* large user block recorded by fate.c (fated): its key and step */
  uint32_t tag;       /* free: 0 = any stream may use it; k = stream slot k only, for now */
  uint32_t fate_step;
  uint64_t epoch;     /* free, tagged: the stream's epoch when it was freed */
  uint8_t kind;
  bool allocated;     /* user: live (false: freed, waiting for events) */
  bool fated;
};

/* A physical allocation of an arena, at pages [first_page, first_page + npages) of it. New
 * memory made for a stitched range is mapped there only when the arena first hands out a
 * block on it (H_UNMAPPED until then): a range that its pages keep serving, turn after turn,
 * never pays for the second mapping. */
enum { H_READY = 0, H_UNMAPPED = 1, H_NOACCESS = 2 /* mapped, cuMemSetAccess failed */,
       H_RELEASED = 3 /* given back by empty_cache: no memory (a K_VOID block) */ };
typedef struct sb_handle_s {
  size_t first_page;
  size_t npages;
  uint64_t handle;
  uint8_t access;
} sb_handle;

struct sb_arena_s {
  bool small;
  bool reserved;      /* the virtual range exists */
  uint64_t base;
  size_t va_size;
  size_t mapped;      /* bytes mapped from base */
  sb_handle* handles; /* in address order, tiling [base, base + mapped) */
  size_t nhandles, cap_handles;
  blockset_t by_addr; /* free blocks by address */
  blockset_t* by_size;/* [tag]: free blocks of that tag by (size, address) */
  sb_block* first;
  sb_block* last;
  size_t grow_bytes;
  size_t nlazy;       /* physical allocations not yet usable at their arena address */
  size_t lazy_from;   /* no page below it is in one of those (a bound, not always the least):
                         most blocks lie below all of them, and arena_ready skips its search */
  size_t released;    /* bytes of H_RELEASED allocations: in mapped, not reserved */
  size_t nreleased;   /* ... and how many */
  uint32_t* ranged;   /* [page]: how many stitched ranges map that page of the arena */
  size_t cap_ranged;
  size_t nranged;     /* pages of the arena some range maps */
  size_t free_bytes;  /* bytes in free blocks (the free sets) */
  size_t free_at_grow;/* free_bytes when the last growth (not for a range) was asked for */
  size_t last_grow_pages;      /* the last growth (not for a stitched range) ... */
  uint64_t allocs_at_last_grow; /* ... and sb_state.nallocs then */
  sb_block key;       /* the search key of fits_begin, kept here so that a search does not
                         clear a whole block on the stack first (that cost ~30% of try_alloc) */
};

struct sb_stitch_s {
  sb_stitch* prev_st;
  sb_stitch* next_st;
  uint64_t va;
  size_t npages;
  size_t page;        /* the page size (the heap's granularity) */
  uint32_t* homes;    /* the range's pages, in order: arena page indices (kSmallHome marks a
                         page of the small arena, else of the large) */
  bool small_homes;   /* some of them are the small arena's */
  size_t offset;      /* where its block starts in the range (past the used part of a
                         partly free first allocation) */
  size_t lent_end;    /* the range's bytes [offset, lent_end) are lent (its block's room) */
  sb_block* user;     /* the live (or pending) block using it, or NULL */
  uint32_t id;        /* its number (turn replay's place for the block it served) */
};

typedef struct sb_stream_s {
  void* stream;
  uint64_t epoch_next; /* the epoch given to blocks freed now */
  bool dirty;          /* blocks freed since the last event on this stream */
  sb_block* thead;     /* free blocks tagged with this slot */
} sb_stream;

typedef struct sb_state_s {
  sb_arena arenas[2];  /* [0] small, [1] large */
  sb_stream* streams;  /* slots 1..nstreams (0 unused) */
  size_t nstreams, cap_streams;
  sb_stitch* stitches;
  uint32_t stitch_ids; /* ranges numbered so far */
  uint64_t stitch_va, stitch_va_end;  /* bump allocation of stitched ranges */
  uint64_t* va_ranges; /* every reservation, for destroy: pairs (va, size) */
  size_t nva_ranges, cap_va_ranges;
  stash_zombies_t zombies; /* memory the driver refused to take back, retried later */
  slab_t block_slab;
  ptrmap_t allocated;  /* address -> user block (live) */
  stash_events_t events;
  uint64_t nallocs;    /* allocation requests so far */
  uint64_t allocs_at_free; /* nallocs at the last free: none freed since, a run that long */
  sb_block* cache[kCacheSizes]; /* [size / 512 - 1]: K_CACHED blocks, linked by tnext */
  size_t ncached;
  size_t cached_bytes;
  stash_loop_t loop;   /* the large blocks' loop detector (loop.c), for turn replay */
  stash_fate_t fate;   /* what the previous step's blocks did (fate.c), for placement */
  uint64_t forecast[kForecastMax][2]; /* _stash_loop_forecast's answer: (offset, size) */
  int64_t live_peak;   /* the most bytes allocated at once since nothing was (the stats' peak
                          resets do not touch it) */
  bool dropped;        /* live bytes have fallen to half of live_peak since: no more bursts */
  bool tight;          /* the device was nearly full at or after the first drop: small pieces */
  bool freed;          /* a block has been freed since nothing was live (else: loading) */
  size_t largest;      /* the largest request since nothing was live */
  bool grown_to_peak;  /* the large arena grew at once to a step's predicted peak (fate.c)
                          since nothing was live: a range's new memory is mapped at once */
  size_t recent[kRecentSizes]; /* the sizes of the last large requests, a ring */
  uint64_t nrecent;    /* large requests so far (the ring's next slot, modulo) */
} sb_state;

static inline sb_state* S(stash_heap_t* h) { return (sb_state*)h->policy_state; }

/* A stitched range's page: its arena and its index there. */
#define kSmallHome ((uint32_t)1 << 31)
static inline sb_arena* home_arena(sb_state* s, uint32_t v) {
  return &s->arenas[v & kSmallHome ? 0 : 1];
}
static inline size_t home_page(uint32_t v) { return v & ~kSmallHome; }
#define G (h->granularity)
#define FROM_SNODE(n) ((sb_block*)((char*)(n) - offsetof(sb_block, snode)))
#define FROM_ANODE(n) ((sb_block*)((char*)(n) - offsetof(sb_block, anode)))
#define PCALL _STASH_PCALL
#define prov_fail _stash_prov_fail

/* ---- Ordered sets ------------------------------------------------------------------------ */

static int cmp_u64(uint64_t a, uint64_t b) { return a < b ? -1 : a > b ? 1 : 0; }

static int cmp_size(const bs_node_t* a, const bs_node_t* b) {
  const sb_block* x = FROM_SNODE(a);
  const sb_block* y = FROM_SNODE(b);
  if (x->size != y->size) return x->size < y->size ? -1 : 1;
  return cmp_u64(x->ptr, y->ptr);
}

static int cmp_addr(const bs_node_t* a, const bs_node_t* b) {
  return cmp_u64(FROM_ANODE(a)->ptr, FROM_ANODE(b)->ptr);
}

/* The sets' orders as key fields (blockset.c compares them inline): (size, address) from a
 * block's snode, its address from its anode. */
_Static_assert(sizeof(size_t) == 8 && sizeof(uint64_t) == 8, "64-bit keys");
#define SNODE_KEY(f) ((ptrdiff_t)offsetof(sb_block, f) - (ptrdiff_t)offsetof(sb_block, snode))
#define ANODE_KEY(f) ((ptrdiff_t)offsetof(sb_block, f) - (ptrdiff_t)offsetof(sb_block, anode))
static void by_size_init(blockset_t* t) {
  _stash_bs_init_keys(t, cmp_size, 2, SNODE_KEY(size), SNODE_KEY(ptr), 0);
}

static sb_block* block_new(sb_state* s) { return _stash_slab_alloc(&s->block_slab); }

static void block_delete(sb_state* s, sb_block* b) {
  free(b->uses);
  _stash_slab_free(&s->block_slab, b);
}

/* Insert a free block into its arena's sets and its tag's list. `place`: a free block that
 * leaves the sets (free_detach'ed) as b comes in, b lying between the same free neighbours
 * by address: b takes its place in the address set without a search, and in the size set
 * too when its size orders there as well - or NULL. */
static void free_insert_at(sb_state* s, sb_block* b, sb_block* place) {
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
  if (b->tag) {
    sb_stream* st = &s->streams[b->tag];
    b->tprev = NULL;
    b->tnext = st->thead;
    if (st->thead) st->thead->tprev = b;
    st->thead = b;
  }
}

static void free_insert(sb_state* s, sb_block* b) { free_insert_at(s, b, NULL); }

/* Take a free block out of its tag's list, leaving it in its sets, for a block to take its
 * place there (free_insert_at) or for free_remove. */
static void free_detach(sb_state* s, sb_block* b) {
  if (b->tag) {
    if (b->tprev) b->tprev->tnext = b->tnext;
    else s->streams[b->tag].thead = b->tnext;
    if (b->tnext) b->tnext->tprev = b->tprev;
    b->tprev = b->tnext = NULL;
  }
}

/* Take a detached free block out of its sets. */
static void free_erase(sb_block* b) {
  _stash_bs_erase(&b->arena->by_size[b->tag], &b->snode);
  _stash_bs_erase(&b->arena->by_addr, &b->anode);
  b->arena->free_bytes -= b->size;
}

static void free_remove(sb_state* s, sb_block* b) {
  free_detach(s, b);
  free_erase(b);
}

static void link_after(sb_block* n, sb_block* b) {
  n->prev = b;
  n->next = b->next;
  if (b->next) b->next->prev = n;
  else b->arena->last = n;
  b->next = n;
}

static void unlink_block(sb_block* b) {
  if (b->prev) b->prev->next = b->next;
  else b->arena->first = b->next;
  if (b->next) b->next->prev = b->prev;
  else b->arena->last = b->prev;
}

/* Tags may merge if equal or if one of them is 0 (usable by any stream): the merged block
 * keeps the stricter tag. */
static bool tags_merge(uint32_t a, uint32_t b) { return a == b || a == 0 || b == 0; }

/* Whether stream slot `slot` may use free block b now. */
static bool tag_ok(const sb_block* b, uint32_t slot) { return b->tag == 0 || b->tag == slot; }

/* b is free and not in the sets: merge it with free neighbours, then insert it - in the
 * place of a neighbour it merged with, if any (free_insert_at). */
static void free_coalesce(sb_state* s, sb_block* b) {
  sb_block* place = NULL; /* a merged neighbour, deleted once b has its place */
  sb_block* n = b->next;
  if (n && n->kind == K_FREE && tags_merge(b->tag, n->tag)) {
    free_detach(s, n);
    b->size += n->size;
    if (n->tag) b->tag = n->tag;
    if (n->epoch > b->epoch) b->epoch = n->epoch;
    unlink_block(n);
    place = n;
  }
  sb_block* p = b->prev;
  if (p && p->kind == K_FREE && tags_merge(b->tag, p->tag)) {
    free_detach(s, p);
    b->ptr = p->ptr;
    b->size += p->size;
    if (p->tag) b->tag = p->tag;
    if (p->epoch > b->epoch) b->epoch = p->epoch;
    unlink_block(p);
    if (place) {
      free_erase(place);
      block_delete(s, place);
    }
    place = p;
  }
  free_insert_at(s, b, place);
  if (place) block_delete(s, place);
}

/* Merge every cached block into its arena. */
static void cache_flush(sb_state* s) {
  if (!s->ncached) return;
  for (size_t i = 0; i < kCacheSizes; i++) {
    for (sb_block* b = s->cache[i]; b;) {
      sb_block* next = b->tnext;
      b->tnext = NULL;
      b->kind = K_FREE;
      free_coalesce(s, b); /* keeps b; merges only K_FREE neighbours */
      b = next;
    }
    s->cache[i] = NULL;
  }
  s->ncached = 0;
  s->cached_bytes = 0;
}

/* The free block containing [addr, addr + size), or NULL. */
static sb_block* free_containing(sb_arena* a, uint64_t addr, size_t size) {
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
 * where that piece cannot exist). Returns the carved block (not in any set, kind to be set by the caller). */
static sb_block* carve(sb_state* s, sb_block* b, uint64_t at, size_t size, sb_block* pre,
                       sb_block* post) {
  free_detach(s, b); /* a piece left free takes b's place in the sets (free_insert_at) */
  sb_block* place = b;
  /* b's size changes while it is still in the sets: the free bytes are set at the end */
  size_t free_after = b->arena->free_bytes - size;
  uint64_t end = b->ptr + b->size;
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
static bool carve_spares(sb_state* s, const sb_block* b, uint64_t at, size_t size,
                         sb_block** pre, sb_block** post) {
  *pre = at > b->ptr ? block_new(s) : NULL;
  *post = at + size < b->ptr + b->size ? block_new(s) : NULL;
  if ((at > b->ptr && !*pre) || (at + size < b->ptr + b->size && !*post)) {
    if (*pre) block_delete(s, *pre);
    if (*post) block_delete(s, *post);
    return false;
  }
  return true;
}

/* ---- Streams and their epochs --------------------------------------------------------------- */

static stash_status_t stream_slot(stash_heap_t* h, void* stream, uint32_t* out) {
  sb_state* s = S(h);
  for (size_t k = 1; k <= s->nstreams; k++) {
    if (s->streams[k].stream == stream) {
      *out = (uint32_t)k;
      return STASH_OK;
    }
  }
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
  if (k > 1) cache_flush(s); /* a second stream: its blocks go by the tags' rules only */
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
  if (--b->event_count == 0) user_free_complete(h, b);
}

/* Before stream `slot` allocates: close the epoch of every other stream that freed blocks,
 * with one event each, so that their blocks become usable by all streams when it completes. */
static stash_status_t close_epochs(stash_heap_t* h, uint32_t slot) {
  sb_state* s = S(h);
  for (size_t k = 1; k <= s->nstreams; k++) {
    sb_stream* st = &s->streams[k];
    if (k == slot || !st->dirty) continue;
    stash_status_t r = _stash_events_record(h, &s->events, &st->stream, 1,
                                            epoch_marker((uint32_t)k, st->epoch_next));
    if (r != STASH_OK) return r;
    st->epoch_next++;
    st->dirty = false;
  }
  return STASH_OK;
}

/* ---- Statistics -------------------------------------------------------------------------------- */

static void stat_inc(stash_stat_t* a, bool small, size_t n) {
  _stash_stat_array_inc(a, small, (int64_t)n);
}
static void stat_dec(stash_stat_t* a, bool small, size_t n) {
  _stash_stat_array_dec(a, small, (int64_t)n);
}

/* A block of the small pool (statistics, the loop detector): by its size, as in PyTorch - a
 * small block may lie in the large arena (try_alloc, in a repeating turn). */
static bool block_small(const sb_block* b) { return b->size <= kSmallLimit; }

/* ---- Arenas: reserving, growing, shrinking ---------------------------------------------------- */

static stash_status_t va_reserve(stash_heap_t* h, size_t size, uint64_t* out) {
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

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* The largest physical allocation new memory for `size` bytes comes in: `least`, or a
 * 1/parts share of a huge request (which would otherwise cost hundreds of pieces). */
static size_t piece_bytes(size_t size, size_t least, size_t parts, size_t granularity) {
  size_t share = round_up(size / parts, granularity);
  return share > least ? share : least;
}

/* max_piece_size_mb, or kTightPiece once the heap is tight: the largest physical allocation
 * the large arena makes, in bytes (a multiple of the granularity), or 0 when the policy
 * chooses (the default). */
static size_t piece_limit(const stash_heap_t* h) {
  size_t m = h->conf.max_piece_size;
  if (!m && ((const sb_state*)h->policy_state)->tight) m = kTightPiece;
  return m && m <= SIZE_MAX / 2 ? round_up(m, G) : 0;
}

static stash_status_t arena_reserve(stash_heap_t* h, sb_arena* a) {
  if (a->reserved) return STASH_OK;
  /* Room for everything the device holds, twice: pages given back at the end and mapped
   * again reuse the same addresses, so the range never runs out. */
  size_t size = round_up(2 * h->device_total, G);
  stash_status_t st = va_reserve(h, size, &a->base);
  if (st != STASH_OK) return st;
  a->va_size = size;
  a->reserved = true;
  return STASH_OK;
}

/* The usable free bytes at the arena's end for a request of stream slot `slot`. */
static size_t free_tail(const sb_arena* a, uint32_t slot) {
  const sb_block* t = a->last;
  if (t && t->kind == K_FREE && (t->tag == 0 || t->tag == slot)) return t->size;
  return 0;
}

/* Map new memory at the arena's end: need_pages, or (unless `exact`) at least the arena's
 * growth step when the limit and the device allow it. The memory is made of physical
 * allocations of at most cap_bytes each (a stitched range can only map whole ones: the
 * driver maps nothing smaller), mapped one by one and made accessible with one call - or,
 * `lazy` (memory for a stitched range), only created: arena_ready maps it on first use. */
static stash_status_t arena_grow(stash_heap_t* h, sb_arena* a, size_t need_pages,
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
  if (a->last && a->last->kind == K_FREE && !tag_ok(a->last, slot)) {
    /* The free end belongs to another stream for now: keep the new memory apart from it
     * (merged, it would take that stream's tag) by giving it to `slot`, for now. */
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

/* Whether a stitched range maps any of pages [first, first + n) of arena a. */
static bool ranged_pages(const sb_arena* a, size_t first, size_t n) {
  if (!a->nranged) return false;
  for (size_t p = first; p < first + n && p < a->cap_ranged; p++)
    if (a->ranged[p]) return true;
  return false;
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
static stash_status_t arena_shrink(stash_heap_t* h, sb_arena* a) {
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

/* The block starting at ptr, from the address-ordered chain (K_VOID blocks are in no set). */
static sb_block* block_at(sb_arena* a, uint64_t ptr) {
  sb_block* b = a->first;
  while (b && b->ptr < ptr) b = b->next;
  return b && b->ptr == ptr ? b : NULL;
}

/* empty_cache's second half: give back every physical allocation of the arena that lies
 * wholly in a free block - between live blocks, where arena_shrink cannot reach - and that no
 * stitched range maps. Its addresses stay the arena's, as a K_VOID block (the arena's tiling
 * and the offsets turn replay remembers do not move); arena_take_back makes memory there
 * again when the arena would otherwise grow. On a failed unmap the allocation stays, free.
 * An allocation in a free block of keep_from bytes or more stays (SIZE_MAX: none does). */
static stash_status_t arena_give_back(stash_heap_t* h, sb_arena* a, size_t keep_from) {
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

static size_t handle_after(const sb_arena* a, size_t p);

/* Memory again behind the allocation empty_cache gave back at v (a K_VOID block), in place.
 * On a failure (STASH_ERR_OOM when the device is full) its calls are undone and v stays void
 * - unless the mapping refused access would not go: then it is held as dead memory, as
 * arena_grow keeps it, and empty_cache retries it. */
static stash_status_t take_back_one(stash_heap_t* h, sb_arena* a, sb_block* v) {
  sb_state* s = S(h);
  sb_handle* hd = &a->handles[handle_after(a, (size_t)(v->ptr - a->base) / G)];
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
static stash_status_t arena_take_back(stash_heap_t* h, sb_arena* a, size_t size, uint32_t slot) {
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
static stash_status_t take_back_range(stash_heap_t* h, sb_arena* a, uint64_t at, size_t size,
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
static stash_status_t arena_revive(stash_heap_t* h, sb_arena* a) {
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
static size_t handle_after(const sb_arena* a, size_t p) {
  size_t i = 0, j = a->nhandles;
  while (i < j) {
    size_t m = (i + j) / 2;
    if (a->handles[m].first_page + a->handles[m].npages <= p) i = m + 1;
    else j = m;
  }
  return i;
}

/* Make [ptr, ptr + size) of the large arena usable before a block there is handed out: map
 * and make accessible the physical allocations under it that were made for a stitched range
 * and not yet mapped at their arena address. On an error nothing is handed out; what was
 * mapped stays mapped (and an allocation mapped but refused access is retried next time). */
static stash_status_t arena_ready(stash_heap_t* h, sb_arena* a, uint64_t ptr, size_t size) {
  size_t lo = (size_t)(ptr - a->base) / G, hi = (size_t)(ptr + size - a->base + G - 1) / G;
  if (!a->nlazy || hi <= a->lazy_from) return STASH_OK;
  for (size_t i = handle_after(a, lo); i < a->nhandles && a->handles[i].first_page < hi; i++) {
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

/* ---- Stitching -------------------------------------------------------------------------------- */

/* Runs of consecutive home pages (of one arena): the body sees run_first (a home) and
 * run_pages. */
#define FOR_RUNS(st, ...)                                                     \
  for (size_t i_ = 0; i_ < (st)->npages;) {                                    \
    size_t j_ = i_ + 1;                                                        \
    while (j_ < (st)->npages && (st)->homes[j_] == (st)->homes[j_ - 1] + 1) j_++; \
    size_t run_first = (st)->homes[i_], run_pages = j_ - i_;                   \
    __VA_ARGS__;                                                               \
    i_ = j_;                                                                   \
  }

/* The arena bytes st lends, [offset, lent_end) of the range through its pages: call the
 * body with each run [run_at, run_at + run_len) of consecutive bytes of arena run_arena. */
#define FOR_LENT(s, st, ...)                                                              \
  for (size_t lo_ = (st)->offset; lo_ < (st)->lent_end;) {                               \
    size_t i_ = lo_ / G, j_ = i_ + 1;                                                    \
    while (j_ * G < (st)->lent_end && (st)->homes[j_] == (st)->homes[j_ - 1] + 1) j_++;  \
    size_t hi_ = j_ * G < (st)->lent_end ? j_ * G : (st)->lent_end;                      \
    sb_arena* run_arena = home_arena((s), (st)->homes[i_]);                              \
    uint64_t run_at = run_arena->base + (uint64_t)home_page((st)->homes[i_]) * G +       \
                      (lo_ - i_ * G);                                                    \
    size_t run_len = hi_ - lo_;                                                          \
    __VA_ARGS__;                                                                         \
    lo_ = hi_;                                                                           \
  }

/* Whether all the memory st lends is free for stream slot `slot` now. */
static bool stitch_available(stash_heap_t* h, const sb_stitch* st, uint32_t slot) {
  bool ok = true;
  FOR_LENT(S(h), st, {
    sb_block* b = free_containing(run_arena, run_at, run_len);
    if (!b || !tag_ok(b, slot)) ok = false;
  });
  return ok;
}

/* The longest run [*lo, *hi) of st's range whose memory in its arenas is free for
 * stream slot `slot` now (to 512 bytes): where blocks have since taken an edge of a cached
 * range's span, its block may still fit a little further along. */
static void stitch_free_run(stash_heap_t* h, const sb_stitch* st, uint32_t slot, size_t* lo,
                            size_t* hi) {
  size_t best_lo = 0, best_hi = 0, run_lo = 0;
  bool in = false;
  for (size_t p = 0; p < st->npages; p++) {
    sb_arena* a = home_arena(S(h), st->homes[p]);
    uint64_t at = a->base + (uint64_t)home_page(st->homes[p]) * G;
    size_t r = p * G;
    sb_block* f = free_containing(a, at, 1); /* the free block holding the page's first byte */
    if (f && !tag_ok(f, slot)) f = NULL;
    if (f && f->ptr + f->size >= at + G) { /* the whole page */
      if (!in) run_lo = r;
      in = true;
      continue;
    }
    if (in) { /* the run ends in this page */
      size_t end = r + (f ? (size_t)(f->ptr + f->size - at) : 0);
      if (end - run_lo > best_hi - best_lo) best_lo = run_lo, best_hi = end;
      in = false;
    }
    sb_block* l = free_containing(a, at + G - kMinBlock, kMinBlock); /* and its last bytes */
    if (l && tag_ok(l, slot) && l->ptr > at) {
      in = true;
      run_lo = r + (size_t)(l->ptr - at);
    }
  }
  if (in && st->npages * G - run_lo > best_hi - best_lo) best_lo = run_lo, best_hi = st->npages * G;
  *lo = best_lo;
  *hi = best_hi;
}

static size_t stitch_runs(stash_heap_t* h, const sb_stitch* st) {
  size_t n = 0;
  FOR_LENT(S(h), st, { (void)run_at; (void)run_len; n++; });
  return n;
}

/* Lend st's home pages: carve them out of their arenas as phantom blocks. Host memory
 * for the metadata is taken first; the pages must be free (stitch_available). */
static stash_status_t stitch_lend(stash_heap_t* h, sb_stitch* st) {
  sb_state* s = S(h);
  size_t runs = stitch_runs(h, st);
  sb_block* spare[3 * 64];
  sb_block** meta = runs <= 64 ? spare : malloc(3 * runs * sizeof *meta);
  if (!meta) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  for (size_t i = 0; i < 3 * runs; i++) {
    meta[i] = block_new(s);
    if (!meta[i]) {
      for (size_t j = 0; j < i; j++) block_delete(s, meta[j]);
      if (meta != spare) free(meta);
      return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    }
  }
  size_t r = 0;
  FOR_LENT(s, st, {
    sb_block* b = free_containing(run_arena, run_at, run_len);
    sb_block* ph = carve(s, b, run_at, run_len, meta[3 * r], meta[3 * r + 1]);
    block_delete(s, meta[3 * r + 2]);
    ph->kind = K_PHANTOM;
    ph->stitch = st;
    r++;
  });
  if (meta != spare) free(meta);
  return STASH_OK;
}

/* Take the pages back: the phantoms become free blocks tagged with the stream that used
 * the stitched block. */
static void stitch_return(stash_heap_t* h, sb_stitch* st, uint32_t tag, uint64_t epoch) {
  sb_state* s = S(h);
  for (int i = st->small_homes ? 0 : 1; i < 2; i++) {
    for (sb_block* b = s->arenas[i].first; b;) {
      sb_block* next = b->next;
      if (b->kind == K_PHANTOM && b->stitch == st) {
        b->kind = K_FREE;
        b->stitch = NULL;
        b->tag = tag;
        b->epoch = epoch;
        free_coalesce(s, b);
      }
      b = next;
    }
  }
}

/* Map st's home pages at st->va, one map call per run within one physical allocation. */
static stash_status_t stitch_map(stash_heap_t* h, sb_stitch* st) {
  size_t done = 0; /* pages mapped so far */
  stash_status_t err = STASH_OK;
  FOR_RUNS(st, {
    sb_arena* a = home_arena(S(h), run_first);
    size_t p = home_page(run_first), left = run_pages;
    while (left && err == STASH_OK) {
      sb_handle* hd = &a->handles[handle_after(a, p)];
      size_t in = hd->first_page + hd->npages - p;
      size_t n = left < in ? left : in;
      err = PCALL(h, map, h->device, st->va + done * G, n * G, hd->handle,
                  (p - hd->first_page) * G);
      if (err != STASH_OK) {
        err = prov_fail(h, err, "map pages into a stitched range");
        break;
      }
      done += n;
      p += n;
      left -= n;
    }
  });
  if (err == STASH_OK) {
    err = PCALL(h, set_access, h->device, st->va, st->npages * G);
    if (err != STASH_OK) err = prov_fail(h, err, "set access to a stitched range");
  }
  if (err != STASH_OK && done && PCALL(h, unmap, h->device, st->va, done * G) != STASH_OK)
    _stash_zombies_add(&S(h)->zombies, st->va, done * G, 0);
  return err;
}

/* Count st's pages in (delta 1) or out (delta -1) of their arenas' `ranged` counts. */
static stash_status_t ranged_add(sb_state* s, const sb_stitch* st, int delta) {
  size_t top[2] = {0, 0}; /* per arena: one past the range's highest page there */
  if (delta > 0) /* (a range counted before has its room) */
    for (size_t i = 0; i < st->npages; i++) {
      size_t* t = &top[home_arena(s, st->homes[i]) == &s->arenas[0] ? 0 : 1];
      if (home_page(st->homes[i]) + 1 > *t) *t = home_page(st->homes[i]) + 1;
    }
  for (int k = 0; k < 2; k++) { /* room first: nothing is counted on a failure */
    sb_arena* a = &s->arenas[k];
    if (top[k] <= a->cap_ranged) continue;
    size_t cap = a->cap_ranged;
    uint32_t* v = _stash_array_grow(a->ranged, &cap, top[k], sizeof *v, 64);
    if (!v) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    memset(v + a->cap_ranged, 0, (cap - a->cap_ranged) * sizeof *v);
    a->ranged = v;
    a->cap_ranged = cap;
  }
  for (size_t i = 0; i < st->npages; i++) {
    sb_arena* a = home_arena(s, st->homes[i]);
    size_t p = home_page(st->homes[i]);
    if (delta > 0 && a->ranged[p]++ == 0) a->nranged++;
    if (delta < 0 && --a->ranged[p] == 0) a->nranged--;
  }
  return STASH_OK;
}

/* Whether [ptr, ptr + size) of arena a touches a page some stitched range maps. */
static bool ranged_at(stash_heap_t* h, const sb_arena* a, uint64_t ptr, size_t size) {
  size_t lo = (size_t)(ptr - a->base) / G, hi = (size_t)(ptr + size - 1 - a->base) / G;
  return ranged_pages(a, lo, hi - lo + 1);
}

static void stitch_unlink(sb_state* s, sb_stitch* st) {
  if (st->prev_st) st->prev_st->next_st = st->next_st;
  else s->stitches = st->next_st;
  if (st->next_st) st->next_st->prev_st = st->prev_st;
}

/* Unmap a free stitched range and forget it. */
static stash_status_t stitch_release(stash_heap_t* h, sb_stitch* st) {
  sb_state* s = S(h);
  stash_status_t r = PCALL(h, unmap, h->device, st->va, st->npages * G);
  if (r != STASH_OK) return prov_fail(h, r, "unmap a stitched range");
  ranged_add(s, st, -1); /* only decrements: cannot fail */
  stitch_unlink(s, st);
  free(st->homes);
  free(st);
  h->stats.num_device_free++;
  return STASH_OK;
}

/* The physical allocations lying wholly inside block b of arena a (of heap h): from the
 * returned index on, while whole_handle_in(a, i, *hi) - they are consecutive in a->handles. */
static size_t whole_handles_from(const stash_heap_t* h, const sb_arena* a, const sb_block* b,
                                 size_t* hi) {
  size_t lo = (size_t)(b->ptr - a->base + G - 1) / G;
  *hi = (size_t)(b->ptr + b->size - a->base) / G;
  size_t i = handle_after(a, lo); /* the one holding page lo, or the first after it ... */
  if (i < a->nhandles && a->handles[i].first_page < lo) i++; /* ... starting at or after lo */
  return i;
}

static bool whole_handle_in(const sb_arena* a, size_t i, size_t hi) {
  return i < a->nhandles && a->handles[i].first_page + a->handles[i].npages <= hi;
}

/* Take into homes (from *got on) the pages of the physical allocations lying wholly inside
 * free block b (of either arena), as long as they fit in n. */
static void take_whole_handles(stash_heap_t* h, const sb_block* b, size_t n, uint32_t* homes,
                               size_t* got) {
  const sb_arena* a = b->arena;
  uint32_t mark = a->small ? kSmallHome : 0;
  size_t hi = 0;
  for (size_t i = whole_handles_from(h, a, b, &hi); whole_handle_in(a, i, hi) && *got < n; i++) {
    const sb_handle* x = &a->handles[i];
    if (*got + x->npages > n) continue;
    for (size_t p = 0; p < x->npages; p++) homes[(*got)++] = (uint32_t)(x->first_page + p) | mark;
  }
}

/* The pages of whole free physical allocations in the large arena's holes (not its free
 * end), largest hole first, into homes: at most n; returns how many. */
static size_t stitch_from_holes(stash_heap_t* h, uint32_t slot, size_t n, uint32_t* homes) {
  sb_arena* a = &S(h)->arenas[1];
  size_t got = 0;
  bs_node_t* it[2] = {_stash_bs_last(&a->by_size[0]),
                      slot ? _stash_bs_last(&a->by_size[slot]) : NULL};
  while (got < n && (it[0] || it[1])) {
    int w = !it[0] ? 1 : !it[1] ? 0 : (cmp_size(it[0], it[1]) > 0 ? 0 : 1);
    sb_block* b = FROM_SNODE(it[w]);
    it[w] = _stash_bs_prev(it[w]);
    if (b->size < kStitchMinRun) break; /* the rest are smaller */
    if (b != a->last) take_whole_handles(h, b, n, homes, &got);
  }
  return got;
}

/* The pages of whole free physical allocations of the small arena, from its end down, into
 * homes: at most n; returns how many. Small requests peak at other times than large ones
 * (an optimizer's step against the forward pass): the small arena's free memory at a large
 * peak serves a stitched range instead of lying idle, and is back for the small requests
 * when the stitched block is freed. */
static size_t stitch_from_small(stash_heap_t* h, uint32_t slot, size_t n, uint32_t* homes) {
  size_t got = 0;
  for (sb_block* b = S(h)->arenas[0].last; b && got < n; b = b->prev)
    if (b->kind == K_FREE && tag_ok(b, slot) && b->size >= G) take_whole_handles(h, b, n, homes, &got);
  return got;
}

/* Whole free physical allocations for a new stitched range, into homes: the large arena's
 * holes', then the small arena's; at most n; returns how many. */
static size_t stitch_from_free(stash_heap_t* h, uint32_t slot, size_t n, uint32_t* homes) {
  size_t got = stitch_from_holes(h, slot, n, homes);
  if (got < n) got += stitch_from_small(h, slot, n - got, homes + got);
  return got;
}

/* Complete the pages of a new stitched range of n pages, homes[0, got) taken from the holes:
 * whole free allocations at the large arena's free end, then new allocations for the rest;
 * then sort them. New memory is mapped at its arena address only when the arena first uses
 * it (arena_ready): a logits range's hundreds of MiB may never be. Less than the arena's
 * smallest growth (kLargeGrowBytes) is mapped there at once, as a growth of the arena would
 * be: a block landing on it later would otherwise map it then, a driver call in what may be a
 * training loop's steady state (eleventh/swin_t_b80: a 4 MiB allocation readied for a 132 MiB
 * block in the second half; docs/policy-stash.md, "Twenty-fifth session") - except once the
 * heap is tight: at its device's limit the pressed ranges' small new memory is as often never
 * used by the arena (tools/fill_price.py: 4 more calls in bert_varlen_train's second half).
 * Also, up to kLargePieceMax, once the arena has grown at once to a step's predicted peak
 * (sb_alloc, fate.c): a range's new memory is then what the prediction missed, at the top of
 * an arena whose blocks already fill it, and the step's blocks drift onto it steps later -
 * ninth/t5_base_b18's 20 MiB, made for its second step's last logits and readied for a 13.5
 * MiB block in its second half (a map and a cuMemSetAccess in the steady state). Larger new
 * memory (a logits range's hundreds of MiB) stays lazy: without the cap, 4 more traces pay
 * the access calls and none gains. */
static stash_status_t stitch_pick(stash_heap_t* h, uint32_t slot, size_t n, size_t got,
                                  uint32_t* homes) {
  sb_state* s = S(h);
  sb_arena* a = &s->arenas[1];
  sb_block* t = a->last;
  if (got < n && t && t->kind == K_FREE && tag_ok(t, slot)) take_whole_handles(h, t, n, homes, &got);
  if (got < n) {
    size_t first = a->mapped / G, fresh = (n - got) * G;
    bool mapped_now = fresh < kLargeGrowBytes || (s->grown_to_peak && fresh <= kLargePieceMax);
    stash_status_t st =
        arena_grow(h, a, n - got, slot, true, piece_bytes(n * G, kStitchPiece, kStitchPieces, G),
                   !mapped_now || s->tight);
    if (st != STASH_OK) return st;
    for (size_t p = first; got < n; p++) homes[got++] = (uint32_t)p;
  }
  /* ascending, for runs */
  for (size_t i = 1; i < n; i++) {
    uint32_t v = homes[i];
    size_t j = i;
    while (j > 0 && homes[j - 1] > v) {
      homes[j] = homes[j - 1];
      j--;
    }
    homes[j] = v;
  }
  return STASH_OK;
}

/* A physical allocation only partly free that can still start or end a stitched range:
 * under the start of a free block, one that begins before the block and ends inside it (its
 * free part: from the block's start to its end); or under a free block's end, one that
 * begins inside the block and ends after it (from its start to the block's end). */
typedef struct sb_edge_s {
  bool found;
  size_t handle; /* index in the large arena's allocations */
  size_t bytes;  /* its free part */
} sb_edge;

/* The edge allocation with the largest free part (at least `least` bytes) among the large
 * arena's free blocks usable by stream slot `slot`: a head (start) or a tail (end), not
 * allocation `other`. */
static sb_edge stitch_edge(stash_heap_t* h, uint32_t slot, bool head, size_t other,
                           size_t least) {
  sb_arena* a = &S(h)->arenas[1];
  sb_edge best = {false, 0, 0};
  for (sb_block* b = a->first; b; b = b->next) {
    if (b->kind != K_FREE || !tag_ok(b, slot) || b->size < least) continue;
    uint64_t end = b->ptr + b->size;
    size_t i = handle_after(a, (size_t)((head ? b->ptr : end - 1) - a->base) / G);
    if (i >= a->nhandles || i == other) continue;
    uint64_t hs = a->base + a->handles[i].first_page * G, he = hs + a->handles[i].npages * G;
    size_t bytes = 0;
    if (head && hs < b->ptr && he <= end) bytes = (size_t)(he - b->ptr);
    if (!head && hs >= b->ptr && he > end) bytes = (size_t)(end - hs);
    if (bytes >= least && bytes > best.bytes) best = (sb_edge){true, i, bytes};
  }
  return best;
}

/* The largest head of the large arena and the largest tail in another allocation, of at
 * least kStitchMinRun each - or, for a request under kStitchEdgeMin not pressed, of at least
 * kStitchSmallEdge, and none if `cached` (a free range that would hold it exists). */
static void stitch_edges(stash_heap_t* h, uint32_t slot, size_t size, bool pressed, bool cached,
                         sb_edge* hd, sb_edge* tl) {
  *hd = *tl = (sb_edge){false, 0, 0};
  bool small = size < kStitchEdgeMin && !pressed;
  if (small && cached) return;
  size_t least = small ? kStitchSmallEdge : kStitchMinRun;
  *hd = stitch_edge(h, slot, true, SIZE_MAX, least);
  *tl = stitch_edge(h, slot, false, hd->found ? hd->handle : SIZE_MAX, least);
}

/* The whole free allocations the holes give a new range of `size` bytes after a head of
 * head_b bytes (stitch_from_free): their first pages, in a buffer of their own that the caller
 * frees (taken), and how many (got). Without host memory for the buffer, taken is NULL and
 * got 0. Counted once per range for both tails below. */
typedef struct sb_holes_s {
  uint32_t* taken;
  size_t got;
} sb_holes;

static sb_holes holes_give(stash_heap_t* h, uint32_t slot, size_t size, size_t head_b) {
  size_t n = (size - head_b) / G;
  sb_holes g = {malloc((n ? n : 1) * sizeof(uint32_t)), 0};
  if (g.taken) g.got = stitch_from_free(h, slot, n, g.taken);
  return g;
}

/* For a new range that would otherwise take new memory after a head of head_b bytes: the
 * largest physical allocation lying wholly in the large arena's free end, as its tail, when
 * the holes' whole allocations and it cover the rest of `size` - so no new memory is made.
 * The range then ends inside that allocation: the block uses only the start of it that the
 * head and the holes leave (the tail's bytes), and the rest stays free in the arena. An
 * allocation larger than what is missing is otherwise never taken (only whole ones that fit
 * the count), and the range would map new memory beside a free one that could have served
 * it. Not taken when a tail found elsewhere is as large. (Without host memory to count the
 * holes' pages, no such tail: the range takes new memory, as it would have.) */
static sb_edge stitch_end_tail(stash_heap_t* h, uint32_t slot, size_t size, size_t head_b,
                               const sb_holes* given, const sb_edge* tail) {
  sb_arena* a = &S(h)->arenas[1];
  sb_edge none = {false, 0, 0};
  const sb_block* t = a->last;
  if (!t || t->kind != K_FREE || !tag_ok(t, slot)) return none;
  size_t hi = 0, best = SIZE_MAX, bytes = 0;
  for (size_t i = whole_handles_from(h, a, t, &hi); whole_handle_in(a, i, hi); i++)
    if (a->handles[i].npages * G > bytes) best = i, bytes = a->handles[i].npages * G;
  if (best == SIZE_MAX || (tail->found && bytes <= tail->bytes)) return none;
  if (!given->taken) return none;
  size_t holes = given->got * G;
  if (head_b + holes >= size || head_b + holes + bytes < size) return none;
  return (sb_edge){true, best, size - head_b - holes};
}

/* For a new range that would otherwise take new memory, or (cover_only) grow the arena: the
 * smallest physical allocation lying wholly in a hole of the large arena (not its free end,
 * stitch_end_tail's) that the holes' whole allocations do not take and that is larger than
 * what they and the head of head_b bytes leave of `size` - as the range's tail, so no new
 * memory is made. The range maps it whole and its block ends inside it; the rest stays free in
 * the arena. The range then takes the same whole allocations of the holes (stitch_from_free
 * takes the largest that fit the count, and the count is what they gave), never this one (it
 * did not fit then). VGG's later steps, whose ranges took new memory beside such allocations:
 * 10-65 MB less reserved and 9-38% less driver time (docs/policy-stash.md, "Thirty-second
 * session"). `given`: holes_give's count for this size and head. */
static sb_edge stitch_hole_tail(stash_heap_t* h, uint32_t slot, size_t size, size_t head_b,
                                const sb_holes* given) {
  sb_arena* a = &S(h)->arenas[1];
  sb_edge none = {false, 0, 0};
  size_t got = given->got;
  if (!given->taken) return none; /* no such tail: new memory, as before */
  if (head_b + got * G >= size) return none;
  size_t missing = size - head_b - got * G, best = SIZE_MAX, bytes = SIZE_MAX;
  for (bs_node_t* nd = _stash_bs_first(&a->by_addr); nd; nd = _stash_bs_next(nd)) {
    const sb_block* b = FROM_ANODE(nd);
    if (b == a->last || !tag_ok(b, slot)) continue;
    size_t hi = 0;
    for (size_t i = whole_handles_from(h, a, b, &hi); whole_handle_in(a, i, hi); i++) {
      size_t nb = a->handles[i].npages * G;
      if (nb <= missing || nb >= bytes) continue;
      bool in = false;
      for (size_t k = 0; k < got && !in; k++)
        in = given->taken[k] == (uint32_t)a->handles[i].first_page;
      if (!in) best = i, bytes = nb;
    }
  }
  return best == SIZE_MAX ? none : (sb_edge){true, best, missing};
}

/* A tail found in a partly free allocation (stitch_edges), cut to what the head of head_b
 * bytes and the holes' whole allocations (`holes` bytes, as holes_give counted them;
 * SIZE_MAX: not counted) leave of `size` - none when they cover it. The range's middle is the
 * room the head and the tail leave, filled with whole allocations of the holes (largest hole
 * first, skipping one that does not fit the room); a tail larger than needed makes the room
 * smaller, and a whole allocation that would have fitted is then skipped for new memory:
 * loops2/llama_b8_frozen's 26.6 MiB tail left a free 192 MiB allocation out and grew 180 MiB.
 * Not in a heap turned tight: at the device's limit it moved 27 traces' smallest device both
 * ways (ninth/vgg16_b48 12 MiB larger, one more trace needing more than expandable segments;
 * docs/policy-stash.md, "Thirty-fifth session"). */
static sb_edge stitch_trim_tail(stash_heap_t* h, size_t size, size_t head_b, size_t holes,
                                sb_edge tail) {
  /* without host memory to count the holes' allocations, the tail as found */
  if (!tail.found || S(h)->tight || holes == SIZE_MAX) return tail;
  if (head_b + holes >= size) return (sb_edge){false, 0, 0};
  if (head_b + holes + tail.bytes > size) tail.bytes = size - head_b - holes;
  return tail;
}

/* Whether live bytes are at their peak so far (within a thousandth of it): nothing much has
 * been freed since they last rose, as in a first forward pass climbing to its peak. */
static bool climbing(stash_heap_t* h) {
  return h->stats.allocated_bytes[STASH_STAT_ALL].current * 1000 >= S(h)->live_peak * 999;
}

/* A stitched block for `size` bytes: a free stitched range of a similar size whose pages are
 * free, else a new one if the holes give enough of it (`cover_only`: if whole free allocations
 * cover all of it, with no new memory; `pressed`: whatever share they give); else *out = NULL:
 * grow the arena. */
/* Whether cached range st may serve a block of `size` bytes: no block uses it, and its room
 * holds the block and is at most twice it and a page (a larger range is left for a larger
 * block). */
static bool range_holds(const stash_heap_t* h, const sb_stitch* st, size_t size) {
  size_t room = st->lent_end - st->offset;
  return !st->user && room >= size && room <= 2 * size + G;
}

/* Make ub range st's block: at the start of its room. */
static void range_user(sb_stitch* st, sb_block* ub, size_t size) {
  ub->ptr = st->va + st->offset;
  ub->size = size;
  ub->stitch = st;
  st->user = ub;
}

static stash_status_t stitch_alloc(stash_heap_t* h, size_t size, uint32_t slot, bool cover_only,
                                   bool pressed, sb_stitch** out) {
  sb_state* s = S(h);
  sb_arena* a = &s->arenas[1];
  sb_stitch* best = NULL;
  bool cached = false; /* a free range that would hold it, but not free as it was */
  for (sb_stitch* st = s->stitches; st; st = st->next_st) {
    if (!range_holds(h, st, size)) continue;
    cached = true;
    if (best && st->lent_end - st->offset >= best->lent_end - best->offset) continue;
    if (stitch_available(h, st, slot)) best = st;
  }
  for (sb_stitch* st = s->stitches; st && !best; st = st->next_st) {
    /* none free as it was: one whose block fits further along (its span moved) */
    size_t lo = 0, hi = 0, offset = st->offset, lent_end = st->lent_end;
    if (st->user || st->npages * G < size || st->npages * G > 2 * size + 2 * G) continue;
    stitch_free_run(h, st, slot, &lo, &hi);
    if (hi - lo < size) continue;
    st->offset = lo;
    st->lent_end = lo + size;
    if (stitch_available(h, st, slot)) {
      best = st;
    } else {
      st->offset = offset;
      st->lent_end = lent_end;
    }
  }
  if (best) {
    stash_status_t r = stitch_lend(h, best);
    if (r != STASH_OK) return r;
    *out = best;
    return STASH_OK;
  }
  /* A new range: whole free allocations from the holes, then from the arena's free end, then
   * new ones. When it would take new memory, it may start with the free end of a partly free
   * allocation (a head) and end in the free start of another (a tail), to take less: the
   * block runs from the head's free part to within the tail's (stitch_edges: how large). */
  size_t need = (size + G - 1) / G;
  uint32_t* homes = malloc(need * sizeof *homes);
  if (!homes) return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  size_t got = stitch_from_free(h, slot, need, homes);
  sb_edge hd = {false, 0, 0}, tl = {false, 0, 0}; /* the best head, and a tail elsewhere */
  bool edges_known = false; /* looked for */
  if (!cover_only && !pressed && got < (need + kStitchHoleShare - 1) / kStitchHoleShare) {
    stitch_edges(h, slot, size, pressed, cached, &hd, &tl);
    edges_known = true;
    size_t edges = (hd.found && hd.bytes < size ? hd.bytes : 0) + (tl.found ? tl.bytes : 0);
    /* in the first forward pass, less than half: grow instead (every byte grown there is
     * needed at the peak the pass climbs to; a range would only add its pieces' access calls);
     * once live bytes have first fallen to half their peak, less than a twentieth, less a
     * page (docs/policy-stash.md, "Twenty-eighth session" and "Thirtieth session") - but half
     * still in a tight heap, which needs a smaller device so; and three quarters (kClimbPct)
     * while a first pass climbs */
    size_t share = s->dropped && !s->tight ? (size_t)kStitchEdgeShare : 2;
    if (share * (got * G + edges + (s->dropped ? G : 0)) < size ||
        (!s->dropped && climbing(h) && (got * G + edges) * 100 < size * kClimbPct)) {
      free(homes);
      *out = NULL;
      return STASH_OK;
    }
  }
  size_t at_end = got;
  if (a->last && a->last->kind == K_FREE && tag_ok(a->last, slot))
    take_whole_handles(h, a->last, need, homes, &at_end);
  if (at_end >= need) {
    hd.found = tl.found = false; /* no new memory: no head or tail either */
  } else if (cover_only) { /* free memory covers it with a tail in a hole, or grow instead */
    sb_holes given = holes_give(h, slot, size, 0); /* no head: edges are not looked for here */
    tl = stitch_hole_tail(h, slot, size, 0, &given);
    free(given.taken);
    if (!tl.found) {
      free(homes);
      *out = NULL;
      return STASH_OK;
    }
  } else {
    if (!edges_known) stitch_edges(h, slot, size, pressed, cached, &hd, &tl);
    if (hd.found && hd.bytes >= size) hd.found = false; /* best fit would have fitted */
    if (tl.found && (hd.found ? hd.bytes : 0) + tl.bytes >= size + G) tl.found = false;
    size_t head_b = hd.found ? hd.bytes : 0;
    sb_holes given = holes_give(h, slot, size, head_b);
    sb_edge end = stitch_end_tail(h, slot, size, head_b, &given, &tl);
    if (end.found) {
      tl = end;
    } else {
      sb_edge hole = stitch_hole_tail(h, slot, size, head_b, &given);
      tl = hole.found ? hole
                      : stitch_trim_tail(h, size, head_b, given.taken ? given.got * G : SIZE_MAX, tl);
    }
    free(given.taken);
  }
  size_t head_b = hd.found ? hd.bytes : 0, tail_b = tl.found ? tl.bytes : 0;
  size_t lead = hd.found ? a->handles[hd.handle].npages : 0;
  size_t trail = tl.found ? a->handles[tl.handle].npages : 0;
  size_t mid = (size - head_b - (tail_b < size - head_b ? tail_b : size - head_b) + G - 1) / G;
  size_t n = lead + mid + trail;
  sb_stitch* st = calloc(1, sizeof *st);
  if (st) st->id = ++s->stitch_ids;
  uint32_t* all = n > need ? realloc(homes, n * sizeof *homes) : homes;
  if (!st || !all) {
    free(st);
    free(all ? all : homes);
    return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  }
  homes = all;
  if (lead || trail) got = stitch_from_free(h, slot, mid, homes + lead); /* fewer, shifted */
  for (size_t p = 0; p < lead; p++) homes[p] = (uint32_t)(a->handles[hd.handle].first_page + p);
  for (size_t p = 0; p < trail; p++)
    homes[lead + mid + p] = (uint32_t)(a->handles[tl.handle].first_page + p);
  st->homes = homes;
  st->npages = n;
  st->page = G;
  st->offset = lead * G - head_b;
  st->lent_end = trail ? st->offset + size : n * G;
  stash_status_t r = STASH_OK;
  if (s->stitch_va + n * G > s->stitch_va_end) {
    size_t span = round_up(4 * h->device_total, G);
    if (span < 2 * n * G) span = round_up(2 * n * G, G);
    r = va_reserve(h, span, &s->stitch_va);
    if (r == STASH_OK) s->stitch_va_end = s->stitch_va + span;
  }
  if (r == STASH_OK) r = stitch_pick(h, slot, mid, got, homes + lead);
  for (size_t p = 0; r == STASH_OK && p < n; p++) st->small_homes |= (homes[p] & kSmallHome) != 0;
  if (r == STASH_OK) r = ranged_add(s, st, 1);
  bool counted = r == STASH_OK;
  if (r == STASH_OK) {
    st->va = s->stitch_va;
    s->stitch_va += n * G + G; /* taken even if mapping fails: a failed unmap may hold it */
    r = stitch_map(h, st);
  }
  if (r == STASH_OK) {
    r = stitch_lend(h, st);
    if (r != STASH_OK && PCALL(h, unmap, h->device, st->va, n * G) != STASH_OK)
      _stash_zombies_add(&S(h)->zombies, st->va, n * G, 0);
  }
  if (r != STASH_OK) {
    /* Pages picked from holes are still free; a mapping made is undone by stitch_map. */
    if (counted) ranged_add(s, st, -1);
    free(homes);
    free(st);
    return r;
  }
  st->next_st = s->stitches;
  if (s->stitches) s->stitches->prev_st = st;
  s->stitches = st;
  h->stats.num_device_alloc++;
  *out = st;
  return STASH_OK;
}

/* ---- Allocation and free ---------------------------------------------------------------------- */

static stash_status_t release_cache(stash_heap_t* h);
static stash_status_t release_cache_keep(stash_heap_t* h, size_t keep_from);

/* Turn replay's hint for a large request of `size` (one stream only): in a repeating turn,
 * the arena offset its counterpart got one turn earlier. */
static bool turn_hint(const sb_state* s, size_t size, uint64_t* off) {
  return s->nstreams <= 1 && _stash_loop_hint(&s->loop, size, off);
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
  if (!rg || !range_holds(h, rg, size) || !stitch_available(h, rg, slot)) return NULL;
  sb_block* ub = block_new(s);
  if (!ub) {
    *st = _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
    return NULL;
  }
  if ((*st = stitch_lend(h, rg)) != STASH_OK) {
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

/* One attempt: a cached block, a stitched block, or a grown arena. */
/* Turn replay: in a loop, a large block goes where its counterpart went one turn earlier
 * if that memory is free now (one stream): its place in the arena, or its stitched range.
 * NULL otherwise, or, with *st set, when the host is out of memory. */
static sb_block* replay(stash_heap_t* h, sb_arena* a, size_t size, uint32_t slot,
                        stash_status_t* st) {
  sb_state* s = S(h);
  uint64_t off = 0;
  if (!turn_hint(s, size, &off)) return NULL;
  if (off & STASH_LOOP_ELSEWHERE) return replay_range(h, (uint32_t)off, size, slot, st);
  uint64_t at = a->base + off;
  sb_block* fb = free_containing(a, at, size);
  if (!fb && a->nreleased && !s->tight) { /* given back by empty_cache: memory there again */
    stash_status_t r = take_back_range(h, a, at, size, slot);
    if (r != STASH_OK && r != STASH_ERR_OOM) {
      *st = r;
      return NULL;
    }
    fb = free_containing(a, at, size);
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
  if (s->nstreams > 1 || !_stash_loop_forecast(&s->loop, size, s->forecast, kForecastMax, &n))
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

/* One placement of a request by the rules above; `pressed`: the device could not serve it as
 * they place it (sb_alloc's retry). */
static stash_status_t try_alloc(stash_heap_t* h, size_t size, uint32_t slot, bool pressed,
                                stash_fate_class_t fate, sb_block** out) {
  sb_state* s = S(h);
  sb_arena* a = &s->arenas[size <= kSmallLimit ? 0 : 1];
  if (!a->small) {
    stash_status_t st = STASH_OK;
    sb_block* r = replay(h, a, size, slot, &st);
    if (st != STASH_OK) return st;
    if (r) {
      r->kind = K_USER;
      *out = r;
      return STASH_OK;
    }
  }
  sb_block* b = NULL;
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
    b = clear_fit(s, a, size, slot);
    /* while little is live (between training steps, optimizer state being made), long-lived
     * blocks pack at the arena's start */
    if (!b && s->live_peak >= (int64_t)kPhaseMinPeak &&
        h->stats.allocated_bytes[STASH_STAT_ALL].current * kQuietShare < s->live_peak)
      b = first_fit(a, size, slot);
  }
  if (a->small && a->nranged) b = ranged_fit(h, a, size, slot);
  if (!b) b = best_fit(a, size, slot);
  /* what empty_cache gave back comes back before new memory - when tight, in the large arena,
   * only once its address range has no room left at its end (new memory comes in pieces) */
  if (!b && a->nreleased &&
      (a->small || !s->tight || a->mapped + round_up(size, G) > a->va_size)) {
    stash_status_t r = arena_take_back(h, a, size, slot);
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
    stash_status_t r = stitch_alloc(h, size, slot, cover_only, pressed, &st);
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
  }
  if (!b) {
    size_t tail = free_tail(a, slot);
    stash_status_t r = arena_grow(h, a, (size - tail + G - 1) / G, slot, false,
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
  if (size < b->size && !(post = block_new(s)))
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

static stash_status_t sb_alloc(stash_heap_t* h, size_t orig, void* stream, uint64_t* out) {
  sb_state* s = S(h);
  if (_stash_ptrmap_reserve(&s->allocated, 1) != STASH_OK)
    return _stash_error(STASH_ERR_HOST_OOM, "alloc: out of host memory");
  stash_status_t st = _stash_events_poll(h, &s->events, false, event_done);
  if (st != STASH_OK) return st;
  uint32_t slot = 0;
  st = stream_slot(h, stream, &slot);
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
  if (size <= kSmallLimit && s->ncached) { /* the fast path: a cached block of this size */
    sb_block** head = &s->cache[size / kMinBlock - 1];
    if (*head && tag_ok(*head, slot)) {
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
  /* what this request's counterpart did a step earlier (fate.c): one stream only, as turn
   * replay */
  stash_fate_class_t fate = STASH_FATE_UNKNOWN;
  if (size > kSmallLimit) {
    fate = _stash_fate_predict(&s->fate, _stash_loop_context(&s->loop), size, live);
    if (s->nstreams > 1) fate = STASH_FATE_UNKNOWN;
    /* The second step of a run whose logits are huge only for it holds more than the first
     * (the optimizer's state) and would grow as it goes, new memory coming above the blocks
     * placed at the top and at the bottom alike: grow the large arena at once to what it is
     * predicted to hold, so that its blocks fit apart (docs/policy-stash.md, "Fates while the
     * arena grows"). */
    int64_t grow_to = _stash_fate_take_growth(&s->fate);
    if (grow_to > (int64_t)h->total_reserved && s->nstreams <= 1 && !s->tight &&
        !piece_limit(h)) {
      size_t pages = ((size_t)grow_to - h->total_reserved + G - 1) / G;
      st = arena_grow(h, &s->arenas[1], pages, slot, true, kLargePieceMax, false);
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
  uint32_t slot = 0;
  for (size_t k = 1; k <= s->nstreams; k++) {
    if (s->streams[k].stream == b->stream) slot = (uint32_t)k;
  }
  sb_stream* sst = &s->streams[slot];
  uint64_t epoch = sst->epoch_next;
  sst->dirty = true;
  if (b->stitch) {
    sb_stitch* st = b->stitch;
    st->user = NULL;
    stitch_return(h, st, slot, epoch);
    block_delete(s, b);
    return;
  }
  b->allocated = false;
  b->requested = 0;
  b->tag = slot;
  b->epoch = epoch;
  free(b->uses);
  b->uses = NULL;
  b->nuses = b->cap_uses = 0;
  if (b->arena->small && s->nstreams <= 1 && s->cached_bytes + b->size <= kCacheMaxBytes &&
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
  if (b->nuses) {
    stash_status_t st = _stash_events_record(h, &s->events, b->uses, b->nuses, b);
    if (st != STASH_OK) {
      (void)_stash_ptrmap_put(&s->allocated, ptr, b); /* cannot fail: its slot was just freed */
      return st;
    }
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
  cache_flush(s);
  stash_status_t st = _stash_events_poll(h, &s->events, true, event_done);
  if (st != STASH_OK) return st;
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
    epoch_done(h, (uint32_t)k, UINT64_MAX >> 24);
  }
  for (sb_stitch* x = s->stitches; x;) {
    sb_stitch* next = x->next_st;
    if (!x->user) {
      stash_status_t r = stitch_release(h, x);
      if (r != STASH_OK && first == STASH_OK) first = r;
    }
    x = next;
  }
  for (int i = 0; i < 2; i++) {
    stash_status_t r = arena_revive(h, &s->arenas[i]);
    if (r != STASH_OK && first == STASH_OK) first = r;
    r = arena_shrink(h, &s->arenas[i]);
    if (r != STASH_OK && first == STASH_OK) first = r;
    r = arena_give_back(h, &s->arenas[i], i ? keep_from : SIZE_MAX);
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

/* ---- Introspection -------------------------------------------------------------------------- */

static stash_block_state_t state_of(const sb_block* b) {
  if (b->kind == K_FREE || b->kind == K_CACHED) return STASH_BLOCK_FREE;
  if (b->kind == K_PHANTOM) return STASH_BLOCK_LENT;
  if (b->kind == K_DEAD || b->kind == K_VOID) return STASH_BLOCK_UNMAPPED; /* none usable */
  return b->allocated ? STASH_BLOCK_ALLOCATED : STASH_BLOCK_PENDING_FREE;
}

typedef struct sb_seg_ref_s { /* a segment to visit: an arena or a stitched range */
  uint64_t address;
  sb_arena* arena;
  sb_stitch* stitch;
} sb_seg_ref;

static int cmp_seg_ref(const void* a, const void* b) {
  return cmp_u64(((const sb_seg_ref*)a)->address, ((const sb_seg_ref*)b)->address);
}

/* An arena's blocks as they are; a stitched range as its user block (if any) and the rest
 * of its pages (ALIAS: their memory is counted where it is LENT, in the large arena). */
static int visit_one(const sb_seg_ref* r, stash_visit_fn fn, void* arg,
                     stash_block_info_t** infos, size_t* cap, stash_status_t* st) {
  if (r->arena) {
    sb_arena* a = r->arena;
    size_t n = 0;
    for (sb_block* b = a->first; b; b = b->next) n++;
    if (n > *cap) {
      stash_block_info_t* v = realloc(*infos, n * sizeof *v);
      if (!v) {
        *st = _stash_error(STASH_ERR_HOST_OOM, "stash_heap_visit: out of host memory");
        return 1;
      }
      *infos = v;
      *cap = n;
    }
    size_t k = 0;
    for (sb_block* b = a->first; b; b = b->next, k++) {
      (*infos)[k] = (stash_block_info_t){(uintptr_t)b->ptr, b->size, b->requested,
                                         state_of(b), b->stream};
    }
    stash_segment_info_t si = {(uintptr_t)a->base, a->mapped, a->mapped - a->released, a->small,
                               true, NULL, n};
    return fn(&si, *infos, arg);
  }
  sb_stitch* x = r->stitch;
  stash_block_info_t bi[3];
  size_t n = 0, span = x->npages * x->page;
  if (x->user) {
    size_t end = x->offset + x->user->size;
    if (x->offset)
      bi[n++] = (stash_block_info_t){(uintptr_t)x->va, x->offset, 0, STASH_BLOCK_ALIAS, NULL};
    bi[n++] = (stash_block_info_t){(uintptr_t)(x->va + x->offset), x->user->size,
                                   x->user->requested, state_of(x->user), x->user->stream};
    if (end < span)
      bi[n++] = (stash_block_info_t){(uintptr_t)(x->va + end), span - end, 0, STASH_BLOCK_ALIAS,
                                     NULL};
  } else {
    bi[n++] = (stash_block_info_t){(uintptr_t)x->va, span, 0, STASH_BLOCK_ALIAS, NULL};
  }
  stash_segment_info_t si = {(uintptr_t)x->va, span, 0, false, true,
                             x->user ? x->user->stream : NULL, n};
  return fn(&si, bi, arg);
}

static stash_status_t sb_visit(stash_heap_t* h, stash_visit_fn fn, void* arg) {
  sb_state* s = S(h);
  size_t n = 2;
  for (sb_stitch* x = s->stitches; x; x = x->next_st) n++;
  sb_seg_ref* refs = malloc(n * sizeof *refs);
  if (!refs) return _stash_error(STASH_ERR_HOST_OOM, "stash_heap_visit: out of host memory");
  size_t k = 0;
  for (int i = 0; i < 2; i++) {
    if (s->arenas[i].mapped) refs[k++] = (sb_seg_ref){s->arenas[i].base, &s->arenas[i], NULL};
  }
  for (sb_stitch* x = s->stitches; x; x = x->next_st) refs[k++] = (sb_seg_ref){x->va, NULL, x};
  qsort(refs, k, sizeof *refs, cmp_seg_ref);
  stash_block_info_t* infos = NULL;
  size_t cap = 0;
  stash_status_t st = STASH_OK;
  for (size_t i = 0; i < k; i++) {
    if (visit_one(&refs[i], fn, arg, &infos, &cap, &st)) break;
  }
  free(infos);
  free(refs);
  return st;
}

#define FAIL(...) return _stash_error(STASH_ERR_INVALID, "heap check: " __VA_ARGS__)

static void pending_ok(void* item, void* arg) {
  if ((uintptr_t)item & 1) return; /* an epoch marker */
  const sb_block* b = item;
  if (b->kind != K_USER || b->allocated || b->event_count <= 0) *(int*)arg = 1;
}

/* Count user block b (pool t) into n, and into *live if allocated; false if a live block
 * is missing from the address map. */
static bool count_user(sb_state* s, stash_stat_counts_t* n, int t, const sb_block* b,
                       size_t* live) {
  n->active[t]++;
  n->active_bytes[t] += (int64_t)b->size;
  n->requested_bytes[t] += (int64_t)b->requested;
  if (!b->allocated) return true;
  n->allocation[t]++;
  n->allocated_bytes[t] += (int64_t)b->size;
  (*live)++;
  return _stash_ptrmap_get(&s->allocated, b->ptr) == b;
}

static stash_status_t sb_check(stash_heap_t* h) {
  sb_state* s = S(h);
  stash_stat_counts_t n = {0}; /* the statistics, counted from the blocks */
  size_t live = 0, total = 0, ncached = 0;
  for (size_t i = 0; i < kCacheSizes; i++) {
    for (sb_block* b = s->cache[i]; b; b = b->tnext) {
      if (b->kind != K_CACHED || b->size != (i + 1) * kMinBlock || !b->arena || !b->arena->small)
        FAIL("a bad block in the cache of %zu-byte blocks", (i + 1) * kMinBlock);
      if (++ncached > s->ncached) FAIL("the cache holds more blocks than it counts");
    }
  }
  if (ncached != s->ncached) FAIL("the cache counts %zu blocks, holds %zu", s->ncached, ncached);
  if (ncached && s->nstreams > 1) FAIL("blocks cached with several streams");
  for (int i = 0; i < 2; i++) {
    sb_arena* a = &s->arenas[i];
    int t = a->small ? STASH_STAT_SMALL : STASH_STAT_LARGE;
    if (!_stash_bs_valid(&a->by_addr)) FAIL("an address tree is malformed");
    size_t nfree = 0, nsize = 0;
    for (size_t k = 0; k <= s->nstreams; k++) {
      if (!_stash_bs_valid(&a->by_size[k])) FAIL("a size tree is malformed");
      nsize += a->by_size[k].count;
    }
    size_t pages = 0;
    size_t nlazy = 0, nreleased = 0, released = 0;
    for (size_t k = 0; k < a->nhandles; k++) {
      const sb_handle* hd = &a->handles[k];
      if (hd->first_page != pages) FAIL("physical allocations do not tile an arena");
      pages += hd->npages;
      if (hd->access == H_RELEASED) {
        nreleased++;
        released += hd->npages * G;
        const sb_block* v = block_at(a, a->base + hd->first_page * G);
        if (!v || v->kind != K_VOID || v->size != hd->npages * G)
          FAIL("memory given back is not one void block at 0x%" PRIx64,
               a->base + hd->first_page * G);
        if (ranged_pages(a, hd->first_page, hd->npages))
          FAIL("memory given back at 0x%" PRIx64 " is still mapped by a stitched range",
               a->base + hd->first_page * G);
      } else {
        nlazy += hd->access != H_READY;
        if (hd->access != H_READY && hd->first_page < a->lazy_from)
          FAIL("an allocation not yet usable in its arena lies below the arena's bound for them");
      }
    }
    if (nlazy != a->nlazy) FAIL("an arena's count of unmapped allocations is wrong");
    if (nreleased != a->nreleased || released != a->released)
      FAIL("an arena's count of memory given back is wrong");
    if (pages * G != a->mapped) FAIL("an arena's mapped size disagrees with its memory");
    n.segment[t] += (int64_t)(a->nhandles - a->nreleased);
    n.reserved_bytes[t] += (int64_t)(a->mapped - a->released);
    total += a->mapped - a->released;
    size_t nvoid = 0, free_sum = 0;
    uint64_t expect = a->base;
    for (sb_block* b = a->first; b; b = b->next) {
      if (b->ptr != expect || !b->size || b->arena != a) FAIL("blocks do not tile an arena at 0x%" PRIx64, expect);
      if (b->ptr % kMinBlock || b->size % kMinBlock) FAIL("an unaligned block");
      if (b->next && b->next->prev != b) FAIL("broken links");
      expect += b->size;
      if (b->kind == K_FREE) {
        nfree++;
        free_sum += b->size;
        if (b->tag > s->nstreams) FAIL("a bad tag");
        if (free_containing(a, b->ptr, b->size) != b) FAIL("a free block is not in the address tree");
        if (b->prev && b->prev->kind == K_FREE && tags_merge(b->tag, b->prev->tag))
          FAIL("free neighbours not merged at 0x%" PRIx64, b->ptr);
      } else if (b->kind == K_VOID) {
        nvoid++; /* each checked above, against its allocation */
      } else if (b->kind == K_DEAD || b->kind == K_CACHED) {
        /* dead: held, not usable, counted in reserved only; cached: checked above */
      } else if (b->kind == K_PHANTOM) {
        if (!b->stitch || !b->stitch->user) FAIL("a phantom block lends to no live stitched block");
      } else if (!count_user(s, &n, block_small(b) ? STASH_STAT_SMALL : STASH_STAT_LARGE, b,
                             &live)) {
        FAIL("a live block is not in the map");
      } else {
        size_t lo = (size_t)(b->ptr - a->base) / G, hi = (size_t)(b->ptr + b->size - a->base + G - 1) / G;
        for (size_t k = handle_after(a, lo); k < a->nhandles && a->handles[k].first_page < hi; k++)
          if (a->handles[k].access != H_READY) FAIL("a live block on memory not mapped at 0x%" PRIx64, b->ptr);
      }
    }
    if (expect != a->base + a->mapped) FAIL("blocks do not span an arena");
    if (nvoid != a->nreleased) FAIL("a void block where no memory was given back");
    if (a->last && a->last->next) FAIL("an arena's last block is not last");
    if (nfree != a->by_addr.count || nfree != nsize) FAIL("the free sets are out of date");
    if (free_sum != a->free_bytes)
      FAIL("an arena counts %zu free bytes, holds %zu", a->free_bytes, free_sum);
  }
  for (sb_stitch* x = s->stitches; x; x = x->next_st) {
    if (x->offset >= x->lent_end || x->lent_end > x->npages * G || x->offset % kMinBlock)
      FAIL("a stitched range lends a bad span");
    {
      size_t nsmall = s->arenas[0].mapped / G, npg = nsmall + s->arenas[1].mapped / G;
      uint8_t* seen = calloc(npg / 8 + 1, 1); /* the small arena's pages, then the large's */
      if (!seen) return _stash_error(STASH_ERR_HOST_OOM, "check: out of host memory");
      bool twice = false, outside = false, small = false;
      for (size_t i = 0; i < x->npages; i++) {
        size_t pg = home_page(x->homes[i]);
        small |= (x->homes[i] & kSmallHome) != 0;
        if (pg >= home_arena(s, x->homes[i])->mapped / G) {
          outside = true;
          break;
        }
        if (!(x->homes[i] & kSmallHome)) pg += nsmall;
        twice |= (seen[pg / 8] >> (pg % 8)) & 1;
        seen[pg / 8] |= (uint8_t)(1u << (pg % 8));
      }
      free(seen);
      if (small != x->small_homes) FAIL("a stitched range misremembers its small-arena pages");
      if (outside) FAIL("a stitched range maps a page outside the arena");
      if (twice) FAIL("a stitched range maps a page twice");
    }
    if (x->user) {
      sb_block* u = x->user;
      if (u->kind != K_USER || u->stitch != x || u->ptr != x->va + x->offset ||
          x->offset + u->size > x->lent_end)
        FAIL("a bad stitched block");
      if (!count_user(s, &n, STASH_STAT_LARGE, u, &live)) FAIL("a live block is not in the map");
      /* all it lends lies in its phantoms */
      bool carved = true;
      FOR_LENT(s, x, {
        bool found = false;
        for (sb_block* b = run_arena->first; b && !found; b = b->next)
          found = b->kind == K_PHANTOM && b->stitch == x && b->ptr <= run_at &&
                  run_at + run_len <= b->ptr + b->size;
        carved &= found;
      });
      if (!carved) FAIL("lent memory is not carved out of the arena");
    }
  }
  for (int k = 0; k < 2; k++) { /* the pages that ranges map, counted as the ranges say */
    const sb_arena* a = &s->arenas[k];
    uint32_t mark = a->small ? kSmallHome : 0;
    uint32_t* want = calloc(a->cap_ranged ? a->cap_ranged : 1, sizeof *want);
    if (!want) return _stash_error(STASH_ERR_HOST_OOM, "heap check: out of host memory");
    bool wrong = false;
    for (sb_stitch* x = s->stitches; x; x = x->next_st)
      for (size_t i = 0; i < x->npages; i++) {
        if ((x->homes[i] & kSmallHome) != mark) continue;
        size_t p = home_page(x->homes[i]);
        if (p < a->cap_ranged) want[p]++;
        else wrong = true;
      }
    size_t pages = 0;
    for (size_t p = 0; p < a->cap_ranged; p++) {
      wrong |= want[p] != a->ranged[p];
      pages += a->ranged[p] != 0;
    }
    free(want);
    if (wrong || pages != a->nranged)
      FAIL("the counts of %s-arena pages in stitched ranges are out of date",
           a->small ? "small" : "large");
  }
  if (live != s->allocated.count) FAIL("the address map holds stale entries");
  if (total != h->total_reserved) FAIL("total reserved %zu != %zu", h->total_reserved, total);
  const stash_stats_t* st = &h->stats;
  stash_status_t r = _stash_stats_check(st, &n);
  if (r != STASH_OK) return r;
  int bad = 0;
  _stash_events_foreach(&s->events, pending_ok, &bad);
  if (bad) FAIL("an event waits on a block that is not pending");
  return STASH_OK;
}

const stash_policy_ops_t _stash_policy_stash = {
    .name = "stash",
    .create = sb_create,
    .destroy = sb_destroy,
    .alloc = sb_alloc,
    .free = sb_free,
    .record_stream = sb_record_stream,
    .empty_cache = sb_empty_cache,
    .visit = sb_visit,
    .check = sb_check,
};
