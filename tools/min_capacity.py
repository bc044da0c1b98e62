#!/usr/bin/env python3
"""The smallest device each configuration completes a trace on: what decides the largest batch
a run fits at the limit of its GPU, where the allocators' out-of-memory fallbacks (PyTorch's
cache flush and retry, policy:stash's pressed stitching) take part, unlike in a replay on a
device with room to spare.

  tools/min_capacity.py [--conf STR]... [--sets S,S...] [--jobs N] [--json] [TRACE...]

For each trace and configuration, `stash-replay --capacity C` is run for C from the trace's
peak live bytes up, in 2 MiB steps, by bisection over a span that depends on peak live alone
(a power of two of 2 MiB steps, at least a quarter of peak live, doubled while it fails): the
result is a capacity at which the replay makes no out-of-memory error and 2 MiB less makes
one, found by the same capacities tried for every configuration and build until their
replays differ. An allocator under pressure
need not be monotonic (a cache flush reshapes what follows), so it is a boundary found, not a
promise for every larger capacity; on the four shared traces every capacity up to 64 MiB
above it completes (tests/test_device_limit.py checks a few).

--conf: a configuration (repeatable; default: policy:stash, policy:stash,max_piece_size_mb:20,
PyTorch's default and expandable segments). --sets: data/traces sets as tools/compare_policies.py
names them (e.g. shared, all). Prints, per trace, each configuration's smallest device and
the live bytes' share of it, then how often each configuration needs the smallest device
(ties count for each) and how it compares with expandable segments.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from compare_policies import SETS, traces as set_traces

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PAGE = 2 << 20
DEFAULT_CONFS = ["policy:stash", "policy:stash,max_piece_size_mb:20", "policy:pytorch",
                 "policy:pytorch,expandable_segments:True"]
EXPANDABLE = "policy:pytorch,expandable_segments:True"


def replay(exe, trace, conf, capacity=None, env=None):
    args = [exe, "--json", "--conf", conf]
    if capacity:
        args += ["--capacity", str(capacity)]
    out = subprocess.run(args + [trace], capture_output=True, text=True, env=env)
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit("%s: %s" % (" ".join(args + [trace]), out.stderr.strip()))
    return json.loads(out.stdout.splitlines()[0])


def min_capacity(exe, trace, conf):
    """(smallest capacity found, peak live, unconstrained peak reserved, replays run).

    The capacities tried depend on the trace's peak live bytes only, never on the
    configuration's own peak: a span of 2 MiB times a power of two above peak live (at least
    a quarter of peak live, doubled while its end fails), then bisection on that dyadic grid.
    Two builds (or configurations) therefore try the same capacities until their replays
    differ, so a difference between them comes from the rules, not from where each search
    began: an allocator under pressure need not be monotonic, and a search started from each
    build's own peak could land on either side of a band of failing capacities (thirty-sixth
    session: thirteenth/vgg11_b128 completes on 5646-5680 MiB and fails on 5720-5790 under
    two builds whose unconstrained peaks differ by 22 MiB)."""
    free = replay(exe, trace, conf)
    live, reserved = free["peak_live_bytes"], free["peak_reserved_bytes"]
    lo = live // PAGE * PAGE  # fails (or is the answer, checked below)
    span = PAGE
    while span * 4 < live:
        span *= 2
    runs = 1
    while replay(exe, trace, conf, lo + span)["ooms"]:  # under pressure it may need more
        runs += 1
        if span > 4 * live + PAGE:
            return None, live, reserved, runs
        span *= 2
    hi = lo + span
    runs += 1
    if replay(exe, trace, conf, lo)["ooms"] == 0:
        return lo, live, reserved, runs + 1
    runs += 1
    while hi - lo > PAGE:
        mid = lo + (hi - lo) // 2  # on the grid: hi - lo is 2 MiB times a power of two
        runs += 1
        if replay(exe, trace, conf, mid)["ooms"] == 0:
            hi = mid
        else:
            lo = mid
    return hi, live, reserved, runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conf", action="append")
    ap.add_argument("--sets")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--replay", default=os.path.join(ROOT, "build", "stash-replay"))
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()
    confs = a.conf or DEFAULT_CONFS
    paths = list(a.traces)
    if a.sets:
        names = SETS if a.sets == "all" else a.sets.split(",")
        bad = [s for s in names if s not in SETS]
        if bad:
            ap.error("unknown set(s): %s (sets: %s)" % (", ".join(bad), ", ".join(SETS)))
        paths += [p for p, _ in set_traces(names) if p.endswith(".csv.gz")]
    if not paths:
        ap.error("give traces or --sets")
    jobs = [(p, c) for p in paths for c in confs]
    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        found = list(ex.map(lambda j: min_capacity(a.replay, j[0], j[1]), jobs))
    rows = {}
    for (p, c), (m, live, reserved, runs) in zip(jobs, found):
        rows.setdefault(p, {})[c] = {"min_capacity": m, "peak_live": live,
                                     "peak_reserved": reserved, "replays": runs}
    if a.json:
        for p in paths:
            print(json.dumps({"trace": os.path.relpath(p, ROOT), "confs": rows[p]}))
        return
    mib = lambda v: "-" if v is None else "%.0f" % (v / 2**20)
    labels = [chr(ord("A") + i) for i in range(len(confs))]
    print("The smallest device, in MiB, each configuration completes the trace on (and the peak "
          "live bytes' share of it):")
    for l, c in zip(labels, confs):
        print("  %s  %s" % (l, c))
    print("%-44s %7s  %s" % ("trace", "live", "  ".join("%16s" % l for l in labels)))
    best = {c: 0 for c in confs}
    for p in paths:
        r = rows[p]
        live = next(iter(r.values()))["peak_live"]
        cells = []
        for c in confs:
            m = r[c]["min_capacity"]
            cells.append("%16s" % ("-" if m is None else "%s (%.2f%%)" % (mib(m), 100.0 * live / m)))
        print("%-44s %7s  %s" % (os.path.relpath(p, ROOT)[-44:], mib(live), "  ".join(cells)))
        have = [r[c]["min_capacity"] for c in confs if r[c]["min_capacity"] is not None]
        for c in confs:
            if have and r[c]["min_capacity"] == min(have):
                best[c] += 1
    print()
    print("traces: %d; needs the smallest device (ties count for each): %s" % (
        len(paths), ", ".join("%s %d" % (l, best[c]) for l, c in zip(labels, confs))))
    if EXPANDABLE in confs:
        for c in confs:
            if c == EXPANDABLE:
                continue
            d = [(rows[p][c]["min_capacity"] - rows[p][EXPANDABLE]["min_capacity"]) / 2**20
                 for p in paths if rows[p][c]["min_capacity"] and rows[p][EXPANDABLE]["min_capacity"]]
            if d:
                print("%s against expandable segments: smaller on %d, the same on %d, larger on %d;"
                      " median %+.0f MiB, from %+.0f to %+.0f" % (
                          labels[confs.index(c)], sum(x < 0 for x in d), sum(x == 0 for x in d), sum(x > 0 for x in d),
                          statistics.median(d), min(d), max(d)))


if __name__ == "__main__":
    sys.exit(main())
