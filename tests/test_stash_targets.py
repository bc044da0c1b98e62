#!/usr/bin/env python3
"""policy:stash's targets (issue 4) on the shared traces, from the real figures in
data/traces/anchors.json:

- memory: utilization (peak live / peak reserved) >= 98%, and peak reserved at or below the
  lowest of PyTorch's four settings and of cudaMallocAsync;
- driver time: modelled_driver_us at most policy:pytorch's (PyTorch's default) on the same
  trace;
- steady state: on fixed-shape traces, no provider call in the second half.

  test_stash_targets.py STASH_REPLAY DATA_DIR TRACE_NAME...
"""
import json
import os
import subprocess
import sys


def replay(exe, path, conf):
    p = subprocess.run([exe, "--json", "--conf", conf, path], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("stash-replay failed (%d) on %s: %s" % (p.returncode, path, p.stderr))
    return json.loads(p.stdout.splitlines()[0])


def targets(st, pt, best, util=True, driver=True, steady=True):
    """The checks, as (what, ok): utilization, reserved at or below `best`, driver time
    at most policy:pytorch's (pt), and no provider call in the second half."""
    u = st["peak_live_bytes"] / st["peak_reserved_bytes"]
    late = st["device_allocs_second_half"] + st["device_frees_second_half"]
    checks = [("reserved %d <= best anchor %d" % (st["peak_reserved_bytes"], best),
               st["peak_reserved_bytes"] <= best)]
    if util:
        checks.insert(0, ("utilization %.2f%% >= 98%%" % (100 * u), u >= 0.98))
    if driver:
        checks.append(("driver %.0f us <= policy:pytorch's %.0f us" % (
            st["modeled_driver_us"], pt["modeled_driver_us"]),
            st["modeled_driver_us"] <= pt["modeled_driver_us"]))
    if steady:
        checks.append(("%d provider calls in the second half == 0" % late, late == 0))
    return checks


def report(name, checks):
    """Print each check; the number that failed."""
    for what, ok in checks:
        print("%-22s %-4s %s" % (name, "ok" if ok else "FAIL", what))
    return sum(not ok for _, ok in checks)


def main():
    exe, data, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    anchors = json.load(open(os.path.join(data, "traces", "anchors.json")))
    failures = 0
    for name in names:
        t = anchors[name]
        path = os.path.join(data, "traces", t["file"])
        best = min([v["peak_reserved_bytes"] for v in t["pytorch"].values()] +
                   [t["cudaMallocAsync_peak_reserved_bytes"]])
        failures += report(name, targets(replay(exe, path, "policy:stash"),
                                         replay(exe, path, "policy:pytorch"), best,
                                         steady=bool(t.get("fixed_shape"))))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
