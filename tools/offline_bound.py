#!/usr/bin/env python3
"""How little one contiguous address range could hold a trace's large blocks: offline, knowing
the whole future (the bound that planning, STAlloc-style, reaches without remapping), and
online, by two best-fit rules that know nothing of it.

  tools/offline_bound.py TRACE [TRACE...]

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
    for row in csv.DictReader(io.StringIO(data.decode())):
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


def peak_live(items):
    ev = sorted([(a, s) for a, _, s in items] + [(b, -s) for _, b, s in items])
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def extent(items, key):
    placed, top = [], 0  # (start, end, offset, size)
    for a, b, s in sorted(items, key=key):
        spans = sorted((o, o + z) for pa, pb, o, z in placed if pa < b and a < pb)
        best, best_len, free_from = None, None, 0
        for lo, hi in spans:
            if lo - free_from >= s and (best is None or lo - free_from < best_len):
                best, best_len = free_from, lo - free_from
            free_from = max(free_from, hi)
        if best is None:
            best = free_from
        placed.append((a, b, best, s))
        top = max(top, best + s)
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
    if len(sys.argv) < 2:
        print(__doc__.strip())
        return 2
    orders = (("size", lambda x: (-x[2], x[0] - x[1], x[0])),
              ("life", lambda x: (x[0] - x[1], -x[2], x[0])),
              ("time", lambda x: x[0]),
              ("best fit", None))
    print("%-36s %7s %12s  %s" % ("trace", "blocks", "peak live", "  ".join(
        "%-22s" % ("extent by " + o) for o, _ in orders)))
    for path in sys.argv[1:]:
        items = blocks(path)
        live = peak_live(items)
        cols = []
        for _, key in orders:
            e = extent(items, key) if key else best_fit(items)
            cols.append("%-22s" % ("%d (%.2f%%)" % (e, 100.0 * live / e if e else 100.0)))
        print("%-36s %7d %12d  %s" % (path.split("/")[-1][:36], len(items), live, "  ".join(cols)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
