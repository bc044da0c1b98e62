#!/usr/bin/env python3
"""Random training-like loops, to compare two builds of policy:stash where the recorded
traces say nothing: each trace is 8 turns of the same 3-7 large allocations (24-150 MiB),
each freed after a random number (1..LIFE) of later allocations - so some blocks live into
the next turn. Writes each loop as an RMM CSV log, replays it under policy:stash with both
stash-replay binaries and counts where the first does better or worse: peak reserved, and
provider calls in the second half of the trace (the steady state).

  tools/synthetic_loops.py A_STASH_REPLAY B_STASH_REPLAY [--seeds 600] [--life turn|long]
                           [--mixed] [--show-seeds]

--life turn: lifetimes of at most one turn's allocations; long (default): up to two more.
--mixed: instead, 10 turns of 4-10 blocks of 3-200 MiB (lifetimes up to two more), and 1-3
small ones (256-1000 KiB, each after one of the large ones, freed 1..2x large allocations
later) that come in a turn or not, at random (probability 0.3-0.7): they take large-arena
memory where turn replay would have placed a block, so hints miss now and then, as on the
recorded Swin and ViT runs (docs/policy-stash.md, "Thirty-sixth session").
--show-seeds: print each loop on which A and B differ.
The seeds make it repeatable (Python's random.Random).
"""
import argparse
import json
import os
import random
import subprocess
import tempfile

MiB = 1 << 20


def csv_log(turns, sizes, lives, after=lambda i: ()):
    """An RMM CSV log of `turns` turns of large blocks of `sizes`, each freed lives[i] large
    allocations later; after(i): (size, life) of the blocks allocated right after large block
    i in this turn (life in large allocations too)."""
    rows, pending, n, ptr = [], [], 0, 0x1000
    for _ in range(turns):
        for i in range(len(sizes)):
            for size, life in [(sizes[i], lives[i])] + list(after(i)):
                ptr += 0x100000
                rows.append(("allocate", ptr, size))
                pending.append((n + life, ptr, size))
            n += 1
            for due in [p for p in pending if p[0] <= n]:
                rows.append(("free", due[1], due[2]))
                pending.remove(due)
    rows += [("free", p[1], p[2]) for p in pending]
    return "Thread,Time,Action,Pointer,Size,Stream\n" + "".join(
        "0,00:00:00.%06d,%s,0x%x,%d,0x0\n" % (i, a, p, s) for i, (a, p, s) in enumerate(rows))


def loop(seed, long_lives):
    r = random.Random(seed)
    k = r.randint(3, 7)
    sizes = [r.choice([24, 40, 60, 100, 150]) * MiB for _ in range(k)]
    lives = [r.randint(1, k + 2 if long_lives else k) for _ in range(k)]
    return csv_log(8, sizes, lives)


def mixed_loop(seed):
    r = random.Random(seed)
    k = r.randint(4, 10)
    sizes = [r.choice([3, 5, 10, 24, 40, 60, 100, 150, 200]) * MiB for _ in range(k)]
    lives = [r.randint(1, k + 2) for _ in range(k)]
    nsmall = r.randint(1, 3)
    small_at = [r.randrange(k) for _ in range(nsmall)]
    small_size = [r.choice([256, 512, 768, 1000]) * 1024 for _ in range(nsmall)]
    small_life = [r.randint(1, 2 * k) for _ in range(nsmall)]
    p_small = r.choice([0.3, 0.5, 0.7])
    return csv_log(10, sizes, lives, lambda i: [
        (small_size[j], small_life[j]) for j in range(nsmall)
        if small_at[j] == i and r.random() < p_small])


def replay(exe, path):
    o = json.loads(subprocess.run([exe, "--json", "--conf", "policy:stash", path],
                                  capture_output=True, text=True, check=True).stdout)
    return (o["peak_reserved_bytes"], o["device_allocs_second_half"] +
            o["device_frees_second_half"], o["utilization"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--seeds", type=int, default=600)
    ap.add_argument("--life", choices=("turn", "long"), default="long")
    ap.add_argument("--mixed", action="store_true")
    ap.add_argument("--show-seeds", action="store_true")
    args = ap.parse_args()
    count = {"reserved lower": 0, "reserved higher": 0, "late fewer": 0, "late more": 0}
    late = util_a = util_b = 0.0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "loop.csv")
        for seed in range(args.seeds):
            with open(path, "w") as f:
                f.write(mixed_loop(seed) if args.mixed else loop(seed, args.life == "long"))
            a, b = replay(args.a, path), replay(args.b, path)
            if args.show_seeds and a[:2] != b[:2]:
                print("seed %d: A %d bytes, %d late calls; B %d bytes, %d late calls"
                      % (seed, a[0], a[1], b[0], b[1]))
            count["reserved lower"] += a[0] < b[0]
            count["reserved higher"] += a[0] > b[0]
            count["late fewer"] += a[1] < b[1]
            count["late more"] += a[1] > b[1]
            late += a[1] - b[1]
            util_a += a[2]
            util_b += b[2]
    n = args.seeds
    print("%d loops (%s): A against B" % (n, "mixed" if args.mixed else "lifetimes: " + args.life))
    for k, v in count.items():
        print("  %-16s %d" % (k, v))
    print("  second-half calls, A minus B: %+d" % late)
    print("  mean utilization: A %.1f%%, B %.1f%%" % (100 * util_a / n, 100 * util_b / n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
