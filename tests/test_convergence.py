#!/usr/bin/env python3
"""policy:stash settles: the four traces of the other loop (gradients freed after the next
forward pass: data/traces/more, more2) make provider calls in their second half, while
policy:stash's layout is still settling (issue 4's steady-state target is not met on them).
This checks that it settles rather than drifts: with the last step repeated 8 more times
(tools/lengthen_trace.py), the replay makes exactly the provider calls of the original
trace - none in the added steps - and reserves exactly as much. A policy that grew a little
every step would fail here (without turn replay all four do: checked by disabling it).

  test_convergence.py STASH_REPLAY DATA_DIR LENGTHEN_TRACE_PY
"""
import json
import os
import subprocess
import sys
import tempfile

TRACES = ["more/gpt2_b4", "more/gpt2_b12", "more2/bert_b32", "more2/gpt2sdpa_b16"]
REPS = 8


def replay(exe, path):
    out = subprocess.run([exe, "--json", "--conf", "policy:stash", path], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.splitlines()[0])


def main():
    exe, data, tool = sys.argv[1:4]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in TRACES:
            path = os.path.join(data, "traces", name + ".snapshot.pickle.gz")
            longer = os.path.join(tmp, os.path.basename(name) + ".csv.gz")
            subprocess.run([sys.executable, tool, path, longer, str(REPS)], check=True,
                           capture_output=True)
            a, b = replay(exe, path), replay(exe, longer)
            same = (a["peak_reserved_bytes"] == b["peak_reserved_bytes"] and
                    a["calls"] == b["calls"] and b["events"] > a["events"])
            print("%-18s %d events: reserved %d, %d provider calls (%d in the 2nd half); "
                  "%d events: reserved %d, %d calls  %s" % (
                      name, a["events"], a["peak_reserved_bytes"],
                      sum(c[0] for c in a["calls"].values()),
                      a["device_allocs_second_half"] + a["device_frees_second_half"],
                      b["events"], b["peak_reserved_bytes"],
                      sum(c[0] for c in b["calls"].values()), "ok" if same else "DRIFTS"))
            failures += not same
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
