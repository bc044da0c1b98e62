#!/usr/bin/env python3
"""tools/compare_policies.py on the four shared traces: policy:stash as it is against the
small arena's old growth (8 MiB every time: kSmallGrowBytes = kSmallBurstMax = 8 MiB, replayed
by an experiment build the tool makes). The old rule's peaks are the ones the seventh
session measured and README published (6085935104, 13738442752, 12857638912, 13723762688
bytes); today's are the scoreboard's. So the tool must report: peak reserved lower on one
(bert_varlen_train, by 2 MiB), the same on one (resnet50_train), higher on two (by 6 MiB), all
three targets on all four under both, and no trace changing sides. Bad settings and sets end
with an error; so does a constant the experiment build is given directly
that is not a positive integer (it aborts, naming it).

  test_compare_policies.py TOOL STASH_REPLAY KNOB_BUILD_DIR
"""
import json
import os
import subprocess
import sys

MiB = 1 << 20
TODAY = {"resnet50_train.csv.gz": 6085935104, "gpt2_train.csv.gz": 13732151296,
         "bert_varlen_train.csv.gz": 12859736064, "gpt2_sidestream_train.csv.gz": 13717471232}
OLD = {"resnet50_train.csv.gz": 6085935104, "gpt2_train.csv.gz": 13738442752,
       "bert_varlen_train.csv.gz": 12857638912, "gpt2_sidestream_train.csv.gz": 13723762688}


def main():
    tool, replay, knobs = sys.argv[1:4]
    failures = []

    def check(what, got, want):
        if got != want:
            failures.append("%s: got %r, want %r" % (what, got, want))

    old = "kSmallGrowBytes=%d,kSmallBurstMax=%d" % (8 * MiB, 8 * MiB)
    p = subprocess.run([sys.executable, tool, "--sets", "shared", "--replay", replay,
                        "--knob-build", knobs, "--json", "defaults", old],
                       capture_output=True, text=True)
    check("exit status", p.returncode, 0)
    if p.returncode == 0:
        out = json.loads(p.stdout)
        a, b = out["settings"]
        check("today's peaks", a["peaks"], TODAY)
        check("the old rule's peaks", b["peaks"], OLD)
        check("all three targets, today", a["all_three"], 4)
        check("all three targets, old rule", b["all_three"], 4)
        c = b["against_first"]
        check("lower/same/higher", (c["peak_lower"], c["peak_same"], c["peak_higher"]), (1, 1, 2))
        check("largest rise", c["peak_delta_max"], 6 * MiB)
        check("largest fall", c["peak_delta_min"], -2 * MiB)
        check("flips", c["flips"], [])
        check("passing under either", len(out["passing_under_any"]), 4)
    for bad, message in ((["defaults", "kSmallGrowBytes"], "bad setting"),
                         (["defaults", "kSmallGrowBytes=lots"], "invalid literal"),
                         (["defaults", "kStitchHoleShare=0"], "positive integers"),
                         (["defaults"], "at least two settings"),
                         (["--sets", "shared,nope", "defaults", "defaults"], "unknown set")):
        q = subprocess.run([sys.executable, tool, "--replay", replay, "--knob-build", knobs] + bad,
                           capture_output=True, text=True)
        if q.returncode == 0 or message not in q.stderr:
            failures.append("%s: exit %d, stderr %r (want an error saying %r)" % (
                bad, q.returncode, q.stderr.strip()[-200:], message))
    env = dict(os.environ, STASH_KNOB_kStitchHoleShare="0")
    q = subprocess.run([os.path.join(knobs, "stash-replay"), "--json",
                        os.path.join(os.path.dirname(tool), "..", "data", "traces",
                                     "gpt2_train.csv.gz")], capture_output=True, text=True,
                       env=env)
    want = "STASH_KNOB_kStitchHoleShare=0: not a positive integer"
    if q.returncode == 0 or want not in q.stderr:
        failures.append("the experiment build given kStitchHoleShare=0: exit %d, stderr %r" % (
            q.returncode, q.stderr.strip()[-200:]))
    for f in failures:
        print("FAIL", f)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
