#!/usr/bin/env python3
"""What policy:stash's automatic rules for a nearly full device cost a run that fits anyway.

Per CSV trace, replay under policy:stash on a simulated device that the trace's own peak
reserved (with room to spare) fills to FILL, with the rules as built and with one setting of
the experiment constants (default kTightPct=1000: never turning tight), and count the traces
whose modelled driver time moved, the ratio (median of those), and the traces that make
provider calls in their second half. The setting runs on the experiment build
(tools/compare_policies.py's, in --knob-build), which also serves as the rules as built.

  tools/fill_price.py [--fills 0.98,0.95,0.9,0.85] [--setting kTightPct=1000] [--jobs N]
                      [--sets shared,hf,...]  (default: every set)
"""
import argparse
import os
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_policies as cp  # noqa: E402
from min_capacity import replay  # noqa: E402


def late(r):
    return r["device_allocs_second_half"] + r["device_frees_second_half"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fills", default="0.98,0.95,0.9,0.85")
    ap.add_argument("--setting", default="kTightPct=1000")
    ap.add_argument("--knob-build", default=os.path.join(cp.ROOT, "build-knobs"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--sets", default=",".join(cp.SETS))
    args = ap.parse_args()
    sets = args.sets.split(",")
    unknown = [s for s in sets if s not in cp.SETS]
    if unknown:
        sys.exit("fill_price: no trace set %s (sets: %s)" % (", ".join(unknown), ", ".join(cp.SETS)))
    fills = [float(f) for f in args.fills.split(",")]
    if any(not 0 < f <= 1 for f in fills):
        sys.exit("fill_price: each fill is in (0, 1]")
    exe, env = cp.side(args.setting, None, args.knob_build)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("STASH_KNOB_")}
    paths = [p for p, _ in cp.traces(sets) if p.endswith(".csv.gz")]  # min_capacity's

    def one(path):
        peak = replay(exe, path, "policy:stash", env=base_env)["peak_reserved_bytes"]
        out = []
        for f in fills:
            cap = int(peak / f)
            out.append((replay(exe, path, "policy:stash", cap, base_env),
                        replay(exe, path, "policy:stash", cap, env)))
        return out

    with ThreadPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(one, paths))
    print("%d CSV traces; as built against %s, on a device each trace's peak reserved fills to:"
          % (len(paths), args.setting))
    print("| fill | driver time moved on | ratio (median of those) | calls in the second half: "
          "as built / setting (most) | out of memory |")
    print("|---:|---:|---:|---:|---:|")
    for i, f in enumerate(fills):
        moved = [r[i][0]["modeled_driver_us"] / r[i][1]["modeled_driver_us"] for r in rows
                 if r[i][0]["modeled_driver_us"] != r[i][1]["modeled_driver_us"]]
        la = [late(r[i][0]) for r in rows if late(r[i][0])]
        lb = [late(r[i][1]) for r in rows if late(r[i][1])]
        oom = sum(1 for r in rows if r[i][0]["ooms"] or r[i][1]["ooms"])
        print("| %.2f | %d | x%.2f | %d / %d (%d / %d) | %d |" % (
            f, len(moved), statistics.median(moved) if moved else 1.0, len(la), len(lb),
            max(la, default=0), max(lb, default=0), oom))
    return 0


if __name__ == "__main__":
    sys.exit(main())
