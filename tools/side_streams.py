#!/usr/bin/env python3
"""Issue 4's targets on the one-stream traces given a second CUDA stream: how policy:stash
copes when some requests come from another stream, as a data loader's or a prefetcher's do.

  tools/side_streams.py [--sets S,S...] [--modes M,M...] [--dir DIR] [--jobs N] [--json]
                        REPLAY [REPLAY ...]

Every recorded one-stream CSV trace (all sets of tools/compare_policies.py but "more", whose
snapshots this does not rewrite, and gpt2_sidestream_train, which has its own side stream) is
rewritten into one trace per mode, moving some allocations - each with its free - to a second
stream:

  first  the trace's first allocation (a side stream used once, at the start);
  small  that, and every 2000 events the next request of at most 1 MiB (the inputs of a
         training step, made on a loader's stream);
  any    the first allocation, and every 2000 events the next request of any size (a side
         stream that asks for any size now and then);
  late   as any, but from event 2000 on: a side stream that first allocates late, when
         everything the main stream freed since its last event waits for one.

The rewritten traces are cached in DIR (default build/side-streams; made again when the tool
or the trace is newer). Each REPLAY (a stash-replay binary: another commit's build, to compare)
replays every rewritten trace under policy:stash, and the three targets are checked against
the anchors of the trace it was made from (PyTorch's four settings replayed by the first
REPLAY's policy:pytorch, and cudaMallocAsync's recorded peak, as tools/compare_policies.py
takes them): how much a side stream costs stash against what the program reserves with one.
The report gives, per mode and REPLAY, the traces meeting all three targets, the memory target
alone, and the traces with provider calls in their second half; with two or more REPLAYs, the
traces gained and lost against the first.

Why (docs/policy-stash.md, "Forty-fifth session" and "Forty-sixth session"): one trace of the
shared four has a second stream, and a rule that acts differently with two streams is
otherwise measured on that one trace.
"""
import argparse
import gzip
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_policies import DATA, ROOT, SETS, anchors, replay, traces  # noqa: E402
from targets_table import targets_met  # noqa: E402

MODES = ["first", "small", "any", "late"]
SIDE = "0x5"  # the second stream's handle, as RMM's log writes one
EVERY = 2000
SMALL = 1 << 20


def rewrite(lines, mode):
    """The CSV lines (header first) with the mode's allocations and their frees on SIDE."""
    hdr = lines[0].split(",")
    act, ptr, size, stream = (hdr.index(c) for c in ("Action", "Pointer", "Size", "Stream"))
    rows = [ln.split(",") for ln in lines[1:]]
    move, live = set(), {}
    want_from = EVERY if mode == "late" else 0  # the next event index at which to move one
    first = mode != "late"
    for i, r in enumerate(rows):
        if r[act] == "allocate":
            live[r[ptr]] = i
            if first:
                move.add(i)
                first = False
                want_from = sys.maxsize if mode == "first" else EVERY
            elif i >= want_from and (mode != "small" or int(r[size]) <= SMALL):
                move.add(i)
                want_from = (i // EVERY + 1) * EVERY
        elif r[act] == "free":
            j = live.pop(r[ptr], None)
            if j in move:
                r[stream] = SIDE
    for i in move:
        rows[i][stream] = SIDE
    return [lines[0]] + [",".join(r) for r in rows]


def made(path, mode, out_dir):
    """The rewritten trace of `path` under `mode`, made unless up to date."""
    rel = os.path.relpath(path, DATA)
    dst = os.path.join(out_dir, mode, rel)
    newest = max(os.path.getmtime(path), os.path.getmtime(__file__))
    if not os.path.exists(dst) or os.path.getmtime(dst) < newest:
        with gzip.open(path, "rt") as f:
            lines = f.read().splitlines()
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = dst + ".tmp"
        with gzip.open(tmp, "wt", compresslevel=1) as f:
            f.write("\n".join(rewrite(lines, mode)) + "\n")
        os.replace(tmp, dst)
    return dst


def one_stream(path):
    with gzip.open(path, "rt") as f:
        hdr = f.readline().rstrip("\n").split(",")
        col = hdr.index("Stream")
        return len({ln.split(",")[col] for ln in f if ln.strip()}) == 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("replays", nargs="+", metavar="REPLAY")
    ap.add_argument("--sets", default=",".join(s for s in SETS if s != "more"))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "side-streams"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sets, modes = args.sets.split(","), args.modes.split(",")
    bad = [s for s in sets if s not in SETS or s == "more"] + [m for m in modes if m not in MODES]
    if bad:
        ap.error("unknown or unusable set(s) or mode(s): %s" % ", ".join(bad))
    for exe in args.replays:
        if not os.access(exe, os.X_OK):
            ap.error("%s: not an executable stash-replay" % exe)
    candidates = [p for p, _ in traces(sets)]
    with ThreadPoolExecutor(args.jobs) as ex:
        paths = [p for p, ok in zip(candidates, ex.map(one_stream, candidates)) if ok]
    anchor = anchors(args.replays[0], paths, args.jobs)
    report = {"traces": len(paths), "modes": {}}
    for mode in modes:
        with ThreadPoolExecutor(args.jobs) as ex:
            side = dict(zip(paths, ex.map(lambda p: made(p, mode, args.dir), paths)))
        per_build = []
        for exe in args.replays:
            def one(path):
                r = replay(exe, ["policy:stash"], side[path])[0]
                a = anchor[path]
                met = targets_met(os.path.basename(path), r, a["min"], a["driver_us"])
                return os.path.relpath(path, DATA), {
                    "all_three": all(met), "memory": met[0], "driver": met[1],
                    "late": r["device_allocs_second_half"] + r["device_frees_second_half"],
                    "peak": r["peak_reserved_bytes"], "utilization": r["utilization"]}
            with ThreadPoolExecutor(args.jobs) as ex:
                res = dict(ex.map(one, paths))
            entry = {"replay": exe,
                     "all_three": sum(v["all_three"] for v in res.values()),
                     "memory": sum(v["memory"] for v in res.values()),
                     "late_calls": sum(v["late"] > 0 for v in res.values()),
                     "per_trace": res}
            if per_build:
                base = per_build[0]["per_trace"]
                entry["gains"] = sorted(k for k, v in res.items()
                                        if v["all_three"] and not base[k]["all_three"])
                entry["losses"] = sorted(k for k, v in res.items()
                                         if base[k]["all_three"] and not v["all_three"])
                entry["peak_lower"] = sum(v["peak"] < base[k]["peak"] for k, v in res.items())
                entry["peak_higher"] = sum(v["peak"] > base[k]["peak"] for k, v in res.items())
            per_build.append(entry)
        report["modes"][mode] = per_build
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print("%d one-stream traces, each given a side stream" % report["traces"])
    for mode, per_build in report["modes"].items():
        for e in per_build:
            line = "%-5s %s: all three %d, memory %d, second-half calls on %d" % (
                mode, e["replay"], e["all_three"], e["memory"], e["late_calls"])
            if "gains" in e:
                line += "; against the first: +%d -%d, peak lower on %d, higher on %d" % (
                    len(e["gains"]), len(e["losses"]), e["peak_lower"], e["peak_higher"])
            print(line)
            for k in e.get("gains", []):
                print("    gains %s" % k)
            for k in e.get("losses", []):
                print("    loses %s" % k)


if __name__ == "__main__":
    main()
