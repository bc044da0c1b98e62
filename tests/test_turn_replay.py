#!/usr/bin/env python3
"""policy:stash's turn replay on two traces it was not tuned on, where best fit alone drifts
and grows in the steady state (one more growth in a late step of each, without replay):

- resnet50_b192 (data/traces/more): all three of issue 4's targets - utilization >= 98%,
  peak reserved at or below PyTorch's default and expandable segments (replayed by
  policy:pytorch, which reproduces the real runs to the byte: fidelity_more), driver time at
  most policy:pytorch's, no provider call in the second half;
- vit_b128 (data/traces/more2): no provider call in the second half, driver time at most
  policy:pytorch's, and peak reserved at or below PyTorch's default and cudaMallocAsync
  (runs.jsonl). (Expandable segments reserve 18.9 MB less there since policy:stash's rules of
  the fifth session; this trace's other loop is not the one those rules were chosen on.)

  test_turn_replay.py STASH_REPLAY DATA_DIR
"""
import json
import os
import sys

from test_stash_targets import replay, report, targets


def main():
    exe, data = sys.argv[1], sys.argv[2]
    failures = 0
    for sub, name, all_targets in (("more", "resnet50_b192", True), ("more2", "vit_b128", False)):
        path = os.path.join(data, "traces", sub, name + ".snapshot.pickle.gz")
        pt = replay(exe, path, "policy:pytorch")
        anchors = [pt["peak_reserved_bytes"]]
        if all_targets:
            anchors.append(replay(exe, path, "policy:pytorch,expandable_segments:True")
                           ["peak_reserved_bytes"])
        for line in open(os.path.join(data, "traces", sub, "runs.jsonl")):
            run = json.loads(line)
            if "cudaMallocAsync" in run.get("conf", "") and name.startswith(run["model"] + "_b"):
                anchors.append(run["max_reserved"])
        failures += report(name, targets(replay(exe, path, "policy:stash"), pt, min(anchors),
                                         util=all_targets))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
