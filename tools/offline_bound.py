#!/usr/bin/env python3
"""How little one contiguous address range could hold a trace's large blocks: offline, knowing
the whole future (the bound that planning, STAlloc-style, reaches without remapping), and
online, by two best-fit rules that know nothing of it.

  tools/offline_bound.py [--min-period P] TRACE [TRACE...]

TRACE: an RMM CSV log or a PyTorch memory snapshot (torch.cuda.memory._snapshot() pickled),
plain or gzip - the formats stash-replay reads. For the blocks over 1 MiB (policy:stash's
large arena; sizes rounded up to 512 bytes) it prints their peak live bytes and the extent
of four placements, each block at one offset for its whole life:
  size: offline: largest first, each into the smallest gap free for its whole life
        ("greedy by size", Pisarchyk & Lee 2020), the usual offline planner;
  life: offline: longest-lived first, likewise;
  time: in allocation order, likewise. The blocks placed before one are those allocated
        before it, so the gaps free for its life are the holes between the blocks live when
        it is allocated: this is an online rule, knowing no future - best fit among the holes
        below the highest live block, and only when none fits, the free space above it
        (extended as far as needed);
  best fit: online too, the usual rule: the smallest free block that fits, the free space
        above the highest live block counting as one of them (so a small request can take
        it while a hole would do), and the range extended only when none fits.
  turns: the time rule until a training loop's turns begin, then each turn planned: its
        blocks largest first, each into the smallest gap free for its whole life around the
        blocks placed before (those living across the turn's start among them) - an oracle
        for one turn at a time, which is what a planner that forecasts a turn from the one
        before it (the allocations of a fixed-shape loop repeat) could reach without
        remapping. The turns: the large blocks' sizes, in allocation order, repeat with a
        period of P allocations (the smallest P >= --min-period, default 50, repeated over
        at least the last 2P allocations); a turn starts at the allocation of the last period
        made with the fewest large bytes live, and every P allocations before and after it.
        The first whole turn is only seen (a planner has nothing to forecast it from): it,
        and everything before it, is placed by the time rule. "-" without a period.
Both online rules grow the range by exactly what is missing, with no granularity.
A ratio (peak live / extent) below 98% under size and life means no allocator that keeps
each block contiguous in one range can reach 98% on the trace, even offline; only remapping
(stitching) can. O(n^2) in the number of large blocks: seconds to a minute for a few thousand.
"""
import bisect
import csv
import gzip
import io
import pickle
import sys

LARGE = 1 << 20


def opened(path):
    with open(path, "rb") as f:
        head = f.read(2)
    return gzip.open(path, "rb") if head == b"\x1f\x8b" else open(path, "rb")


def events(path):
    """(op, key, size) in order: op 'a' or 'f'."""
    with opened(path) as f:
        data = f.read()
    if data[:1] == b"\x80":  # a pickle
        snap = pickle.loads(data)
        trace = next(t for t in snap["device_traces"] if t)
        for e in trace:
            if e["action"] == "alloc":
                yield "a", e["addr"], e["size"]
            elif e["action"] == "free_completed":
                yield "f", e["addr"], e["size"]
        return
    rows = csv.DictReader(io.StringIO(data.decode()))
    missing = {"Action", "Pointer", "Size", "Stream"} - set(rows.fieldnames or ())
    if missing:
        raise ValueError("not an RMM CSV log or a PyTorch snapshot: no column %s" %
                         ", ".join(sorted(missing)))
    for row in rows:
        if row["Action"] == "allocate":
            yield "a", (row["Stream"], row["Pointer"]), int(row["Size"])
        elif row["Action"] == "free":
            yield "f", (row["Stream"], row["Pointer"]), int(row["Size"])


def blocks(path):
    """[start, end, size] of every block over 1 MiB; end = len(events) if never freed."""
    live, out, n = {}, [], 0
    for n, (op, key, size) in enumerate(events(path)):
        if op == "a":
            live[key] = (n, (size + 511) // 512 * 512)
        elif key in live:
            start, rounded = live.pop(key)
            if rounded > LARGE:
                out.append([start, n, rounded])
    out += [[s, n + 1, r] for s, r in live.values() if r > LARGE]
    return out


def live_series(items):
    """The events' times, in order, and the large bytes live after each."""
    ev = sorted([(a, s) for a, _, s in items] + [(b, -s) for _, b, s in items])
    times, live, cur = [], [], 0
    for t, d in ev:
        cur += d
        times.append(t)
        live.append(cur)
    return times, live


def peak_live(items):
    return max(live_series(items)[1], default=0)


BY_SIZE = lambda x: (-x[2], x[0] - x[1], x[0])  # largest first, then longest-lived, earliest
BY_TIME = lambda x: x[0]  # in allocation order


def place(placed, a, b, s):
    """The offset of the smallest gap that holds s bytes for all of [a, b) among the placed
    blocks (start, end, offset, size) living then (the lowest of equal ones), or the free space
    above them."""
    spans = sorted((o, o + z) for pa, pb, o, z in placed if pa < b and a < pb)
    best, best_len, free_from = None, None, 0
    for lo, hi in spans:
        if lo - free_from >= s and (best is None or lo - free_from < best_len):
            best, best_len = free_from, lo - free_from
        free_from = max(free_from, hi)
    return free_from if best is None else best


def extent(items, key, placed=None):
    placed = [] if placed is None else placed  # (start, end, offset, size)
    top = max((o + z for _, _, o, z in placed), default=0)
    for a, b, s in sorted(items, key=key):
        o = place(placed, a, b, s)
        placed.append((a, b, o, s))
        top = max(top, o + s)
    return top


def turn_starts(items, min_period):
    """Indices (into items, in allocation order) where turns start, or None: see "turns"."""
    sizes = [s for _, _, s in items]
    n, period = len(sizes), None
    for p in range(min_period, n // 2 + 1):
        k = 0
        while k < n - p and sizes[n - 1 - k] == sizes[n - 1 - k - p]:
            k += 1
        if k >= 2 * p:
            period = p
            break
    if not period:
        return None
    times, live = live_series(items)

    def live_before(t):  # large bytes live just before event t
        i = bisect.bisect_left(times, t)
        return live[i - 1] if i else 0
    first = min(range(n - period, n), key=lambda i: (live_before(items[i][0]), i)) % period
    return list(range(first + period, n, period))  # the first turn is seen, not planned


def turn_plan(items, min_period):
    items = sorted(items)
    starts = turn_starts(items, min_period)
    if starts is None:
        return None
    placed = []
    top = extent(items[:starts[0]], BY_TIME, placed)
    bounds = starts + [len(items)]
    for i in range(len(starts)):
        top = max(top, extent(items[bounds[i]:bounds[i + 1]], BY_SIZE, placed))
    return top


def best_fit(items):
    """The extent under plain online best fit: free blocks merged with their neighbours, the
    smallest that fits taken (the lowest of equal ones) and split at its front; the range
    grows at its end, from its free end if it has one, when none fits."""
    ev = sorted([(a, 1, i) for i, (a, _, _) in enumerate(items)] +
                [(b, 0, i) for i, (_, b, _) in enumerate(items)])
    free, top, at = [], 0, {}  # free: [offset, size] by offset
    for _, is_alloc, i in ev:
        s = items[i][2]
        if not is_alloc:
            o = at.pop(i)
            k = bisect.bisect(free, [o, 0])
            free.insert(k, [o, s])
            if k + 1 < len(free) and o + s == free[k + 1][0]:
                free[k][1] += free.pop(k + 1)[1]
            if k > 0 and free[k - 1][0] + free[k - 1][1] == o:
                free[k - 1][1] += free.pop(k)[1]
            continue
        fits = [k for k, (_, z) in enumerate(free) if z >= s]
        if fits:
            k = min(fits, key=lambda k: (free[k][1], free[k][0]))
        else:
            if not free or free[-1][0] + free[-1][1] != top:
                free.append([top, 0])
            top += s - free[-1][1]
            free[-1][1] = s
            k = len(free) - 1
        at[i] = free[k][0]
        free[k][0] += s
        free[k][1] -= s
        if not free[k][1]:
            free.pop(k)
    return top


def main():
    args = sys.argv[1:]
    min_period = 50
    if args[:1] == ["--min-period"]:
        if len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
            print("offline_bound.py: --min-period wants a positive number", file=sys.stderr)
            return 2
        min_period, args = int(args[1]), args[2:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if not args:
        print(__doc__.strip())
        return 2
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        print("offline_bound.py: unknown option %s (usage: offline_bound.py [--min-period P] "
              "TRACE [TRACE...]; --help for more)" % unknown[0], file=sys.stderr)
        return 2
    orders = (("size", BY_SIZE),
              ("life", lambda x: (x[0] - x[1], -x[2], x[0])),
              ("time", BY_TIME),
              ("best fit", None),
              ("turns", "turns"))
    print("%-36s %7s %12s  %s" % ("trace", "blocks", "peak live", "  ".join(
        "%-22s" % ("extent by " + o) for o, _ in orders)))
    for path in args:
        try:
            items = blocks(path)
        except (OSError, EOFError, ValueError, KeyError, IndexError, StopIteration,
                pickle.UnpicklingError, UnicodeDecodeError) as e:
            print("offline_bound.py: %s: cannot read the trace: %s" % (path, e or type(e).__name__),
                  file=sys.stderr)
            return 1
        live = peak_live(items)
        cols = []
        for _, key in orders:
            if key == "turns":
                e = turn_plan(items, min_period)
                if e is None:
                    cols.append("%-22s" % "-")
                    continue
            else:
                e = extent(items, key) if key else best_fit(items)
            cols.append("%-22s" % ("%d (%.2f%%)" % (e, 100.0 * live / e if e else 100.0)))
        print("%-36s %7d %12d  %s" % (path.split("/")[-1][:36], len(items), live, "  ".join(cols)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
