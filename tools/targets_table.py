#!/usr/bin/env python3
"""Issue 4's table for a directory of recorded traces: per trace, PyTorch's default,
expandable segments and cudaMallocAsync against policy:stash, and which of the three targets
policy:stash meets there.

  tools/targets_table.py [--replay build/stash-replay] DIR [DIR...]

DIR holds RMM CSV logs (*.csv.gz) and async.jsonl (one line per trace: "workload" and the
cudaMallocAsync pool's "peak_reserved_bytes", as tools/gpu/run_record_hf_gpu.sh writes it);
data/traces/hf and data/traces/holdout are such directories - or, instead of async.jsonl,
anchors.json (the shared traces' file: per trace its "file" and
"cudaMallocAsync_peak_reserved_bytes"), as data/traces itself has. The anchors are PyTorch's four
settings (replayed by policy:pytorch, which reproduces the real runs: ctest -R fidelity_more)
and cudaMallocAsync. The targets (issue 4): memory - utilization (peak live / peak reserved)
>= 98% and peak reserved at or below every anchor; driver time - modeled driver µs at most
policy:pytorch's; steady state - no provider call in the second half (not asked of a trace
whose shapes vary: a name with "varlen"). Prints a Markdown table and a count.
"""
import argparse
import glob
import json
import os
import subprocess

CONFS = ["policy:stash", "policy:pytorch", "policy:pytorch,expandable_segments:True",
         "policy:pytorch,max_split_size_mb:200", "policy:pytorch,roundup_power2_divisions:4"]


def replay(exe, path):
    args = [exe, "--json"] + sum([["--conf", c] for c in CONFS], []) + [path]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return {o["conf"]: o for o in map(json.loads, out.splitlines())}


def targets_met(name, stash, lowest_anchor, default_driver_us):
    """Issue 4's three targets for a policy:stash replay of trace `name` (stash-replay's JSON
    object): (memory, driver time, steady state), each True when met."""
    late = stash["device_allocs_second_half"] + stash["device_frees_second_half"]
    memory = (stash["peak_live_bytes"] / stash["peak_reserved_bytes"] >= 0.98 and
              stash["peak_reserved_bytes"] <= lowest_anchor)
    driver = stash["modeled_driver_us"] <= default_driver_us
    steady = late == 0 or "varlen" in name
    return memory, driver, steady


def row(name, by, async_peak):
    s, p, e = by[CONFS[0]], by[CONFS[1]], by[CONFS[2]]
    live = s["peak_live_bytes"]
    anchors = [by[c]["peak_reserved_bytes"] for c in CONFS[1:]] + [async_peak]
    late = s["device_allocs_second_half"] + s["device_frees_second_half"]
    memory, driver, steady = targets_met(name, s, min(anchors), p["modeled_driver_us"])
    met = [w for w, ok in (("memory", memory), ("driver time", driver),
                           ("steady state", steady)) if ok]
    note = "all three" if len(met) == 3 else (", ".join(met) or "none")
    if s["peak_reserved_bytes"] > min(anchors):
        which = "expandable" if min(anchors) == e["peak_reserved_bytes"] else "an anchor"
        note += " (above %s by %.1f MB)" % (which, (s["peak_reserved_bytes"] - min(anchors)) / 1e6)

    def cell(o):
        return "%d (%.1f%%), %.0f µs" % (o["peak_reserved_bytes"],
                                         100 * live / o["peak_reserved_bytes"],
                                         o["modeled_driver_us"])
    return ("| %s | %s | %s | %d (%.1f%%) | **%d (%.2f%%)**, %.0f µs, 2nd half %d | %s |" % (
        name, cell(p), cell(e), async_peak, 100 * live / async_peak, s["peak_reserved_bytes"],
        100 * live / s["peak_reserved_bytes"], s["modeled_driver_us"], late, note),
        len(met) == 3)


def async_peaks(d):
    """cudaMallocAsync's peak reserved per trace name in directory d, from its async.jsonl
    or, failing that, its anchors.json."""
    peaks = {}
    if os.path.exists(os.path.join(d, "async.jsonl")):
        for line in open(os.path.join(d, "async.jsonl")):
            run = json.loads(line)
            peaks[run["workload"]] = run["peak_reserved_bytes"]
    elif os.path.exists(os.path.join(d, "anchors.json")):
        for v in json.load(open(os.path.join(d, "anchors.json"))).values():
            peaks[v["file"][:-len(".csv.gz")]] = v["cudaMallocAsync_peak_reserved_bytes"]
    else:
        raise SystemExit("targets_table: %s has neither async.jsonl nor anchors.json" % d)
    return peaks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                     "stash-replay"))
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    anchors = [async_peaks(d) for d in a.dirs]  # (a directory without them stops here)
    print("| trace | PyTorch default | PyTorch expandable | cudaMallocAsync | policy:stash "
          "| targets met |")
    print("|---|---|---|---|---|---|")
    total = ok = 0
    for d, peaks in zip(a.dirs, anchors):
        for path in sorted(glob.glob(os.path.join(d, "*.csv.gz"))):
            name = os.path.basename(path)[:-len(".csv.gz")]
            if name not in peaks:
                raise SystemExit("targets_table: no cudaMallocAsync figure for %s in %s" % (
                    name, d))
            line, all_met = row(name, replay(a.replay, path), peaks[name])
            print(line)
            total += 1
            ok += all_met
    print("\n%d of %d traces meet all three targets" % (ok, total))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
