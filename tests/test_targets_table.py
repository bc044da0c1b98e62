#!/usr/bin/env python3
"""tools/targets_table.py on data/traces itself, whose cudaMallocAsync figures are in
anchors.json (not async.jsonl): a row per shared trace, its cudaMallocAsync column the
recorded figure, policy:stash meeting all three targets on each (as the scoreboard says);
a directory with neither file is refused with a clear message and no table.

  test_targets_table.py TOOL STASH_REPLAY DATA_DIR
"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    tool, replay, data = sys.argv[1:4]
    traces = os.path.join(data, "traces")
    bad = []
    p = subprocess.run([sys.executable, tool, "--replay", replay, traces], capture_output=True,
                       text=True)
    if p.returncode:
        print(p.stdout + p.stderr)
        return 1
    rows = [l for l in p.stdout.splitlines() if l.startswith("| ") and not l.startswith("| trace")]
    anchors = json.load(open(os.path.join(traces, "anchors.json")))
    want = sorted(v["file"][:-len(".csv.gz")] for v in anchors.values())
    got = sorted(r.split(" | ")[0][2:] for r in rows)
    if got != want:
        bad.append("rows %s, want %s" % (got, want))
    for v in anchors.values():
        name = v["file"][:-len(".csv.gz")]
        row = next((r for r in rows if r.startswith("| %s |" % name)), "")
        cells = row.split(" | ")
        if len(cells) < 6 or not cells[3].startswith("%d (" % v["cudaMallocAsync_peak_reserved_bytes"]):
            bad.append("%s: cudaMallocAsync cell %r" % (name, cells[3] if len(cells) > 3 else row))
        if not row.endswith("| all three |"):
            bad.append("%s: %r" % (name, row))
    if "\n%d of %d traces meet all three targets" % (len(want), len(want)) not in p.stdout:
        bad.append("count line missing: %r" % p.stdout.splitlines()[-1:])
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "x.csv.gz"), "wb").close()
        q = subprocess.run([sys.executable, tool, "--replay", replay, tmp], capture_output=True,
                           text=True)
        if q.returncode == 0 or "neither async.jsonl nor anchors.json" not in q.stderr or q.stdout:
            bad.append("a directory without anchors: rc %d, %r, %r" % (q.returncode, q.stdout,
                                                                        q.stderr))
    for b in bad:
        print("FAIL: " + b)
    print("%d failure(s)" % len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
