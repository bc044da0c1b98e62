#!/usr/bin/env python3
"""tools/fill_price.py on the four shared traces: what turning tight costs a run that fits.
On a device each trace's own peak reserved fills to 98%, every one of the four turns tight
(its live bytes first fall to half their peak with 90% of the device held): modelled driver
time moves on all four, 3.25x in the median against the rules never turning tight
(kTightPct=1000; 3.23x before the forty-ninth session, whose batched event queries lowered
gpt2_sidestream_train's driver time; 3.21x in the forty-fifth session, whose rules for several streams moved
gpt2_sidestream_train, 3.24x before them, 3.30x before the thirtieth session's stitching
rules; the forty-sixth session's moved gpt2_sidestream_train again), and one of them then
calls the driver in its second half, 596 times (before the twenty-seventh session's step
fates two did, one 594 times, at 3.37x).
At 85% none turns tight: nothing moves, and the one trace that calls late does so either way
(18 calls: bert_varlen_train, whose longer sequences come late; 20 before the twenty-seventh
session's step fates). No run runs out of memory.
A set that does not exist is refused.

  test_fill_price.py TOOL KNOB_BUILD_DIR
"""
import subprocess
import sys


def main():
    tool, knobs = sys.argv[1:3]
    failures = []

    def check(what, got, want):
        if got != want:
            failures.append("%s: got %r, want %r" % (what, got, want))

    p = subprocess.run([sys.executable, tool, "--sets", "shared", "--fills", "0.98,0.85",
                        "--knob-build", knobs, "--jobs", "2"], capture_output=True, text=True)
    check("exit status", p.returncode, 0)
    rows = [line for line in p.stdout.splitlines() if line.startswith("| 0.")]
    check("first line", p.stdout.splitlines()[:1],
          ["4 CSV traces; as built against kTightPct=1000, on a device each trace's peak "
           "reserved fills to:"])
    check("rows", rows, ["| 0.98 | 4 | x3.25 | 1 / 1 (596 / 18) | 0 |",
                         "| 0.85 | 0 | x1.00 | 1 / 1 (18 / 18) | 0 |"])
    p = subprocess.run([sys.executable, tool, "--sets", "shared,nosuchset", "--knob-build", knobs],
                       capture_output=True, text=True)
    check("a set that does not exist: exit status", p.returncode, 1)
    check("... its message", "fill_price: no trace set nosuchset" in p.stderr, True)
    for f in failures:
        print("FAIL", f)
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
