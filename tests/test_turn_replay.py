#!/usr/bin/env python3
"""policy:stash's turn replay on two traces it was not tuned on, where best fit alone drifts
and grows in the steady state (one more growth in a late step of each, without replay):

- resnet50_b192 (data/traces/more): all three of issue 4's targets - utilization >= 98%,
  peak reserved at or below PyTorch's default and expandable segments (replayed by
  policy:pytorch, which reproduces the real runs to the byte: fidelity_more), driver time at
  most policy:pytorch's, no provider call in the second half;
- vit_b128 (data/traces/more2): no provider call in the second half, and peak reserved at
  or below PyTorch's default, expandable segments and cudaMallocAsync (runs.jsonl).

  test_turn_replay.py STASH_REPLAY DATA_DIR
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


def main():
    exe, data = sys.argv[1], sys.argv[2]
    failures = 0
    for sub, name, all_targets in (("more", "resnet50_b192", True), ("more2", "vit_b128", False)):
        path = os.path.join(data, "traces", sub, name + ".snapshot.pickle.gz")
        st = replay(exe, path, "policy:stash")
        pt = replay(exe, path, "policy:pytorch")
        ex = replay(exe, path, "policy:pytorch,expandable_segments:True")
        anchors = [pt["peak_reserved_bytes"], ex["peak_reserved_bytes"]]
        for line in open(os.path.join(data, "traces", sub, "runs.jsonl")):
            run = json.loads(line)
            if "cudaMallocAsync" in run.get("conf", "") and name.startswith(run["model"] + "_b"):
                anchors.append(run["max_reserved"])
        util = st["peak_live_bytes"] / st["peak_reserved_bytes"]
        late = st["device_allocs_second_half"] + st["device_frees_second_half"]
        checks = [("%d provider calls in the second half == 0" % late, late == 0),
                  ("reserved %d <= best anchor %d" % (st["peak_reserved_bytes"], min(anchors)),
                   st["peak_reserved_bytes"] <= min(anchors))]
        if all_targets:
            checks += [("utilization %.2f%% >= 98%%" % (100 * util), util >= 0.98),
                       ("driver %.0f us <= policy:pytorch's %.0f us" % (
                           st["modeled_driver_us"], pt["modeled_driver_us"]),
                        st["modeled_driver_us"] <= pt["modeled_driver_us"])]
        for what, ok in checks:
            print("%-14s %-4s %s" % (name, "ok" if ok else "FAIL", what))
            failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
