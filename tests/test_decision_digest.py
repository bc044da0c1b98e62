#!/usr/bin/env python3
"""Decisions do not depend on where the host's memory lies: `bench_replay --digest` (a hash of
every address a heap returned over three passes of a trace, with its peak reserved bytes and
provider calls) prints the same lines in two processes whose host memory is laid out apart -
the second with malloc's pad, perturbation and mmap threshold moved, and a large environment
that shifts the stack - under both policies, on a one-stream trace, a two-stream trace and a
PyTorch snapshot. A policy that broke a tie by a host pointer (its block metadata's address)
would differ here. bench/same_decisions.sh compares two sources the same way.

  test_decision_digest.py BENCH_REPLAY DATA_DIR
"""
import os
import subprocess
import sys

BENCH, DATA = (os.path.abspath(a) for a in sys.argv[1:3])
TRACES = [os.path.join(DATA, "traces", t) for t in
          ("resnet50_train.csv.gz", "gpt2_sidestream_train.csv.gz",
           "more/gpt2_b4.snapshot.pickle.gz")]
CONFS = ["policy:stash", "policy:pytorch"]
failures = []


def check(cond, what):
    print("%-70s %s" % (what, "ok" if cond else "FAIL"))
    if not cond:
        failures.append(what)


def digests(env, confs=CONFS):
    args = [BENCH, "--digest"]
    for c in confs:
        args += ["--conf", c]
    p = subprocess.run(args + TRACES, capture_output=True, text=True, timeout=600, env=env)
    if p.returncode:
        print(p.stderr)
    return p.stdout.splitlines()


plain = digests(dict(os.environ))
moved = digests(dict(os.environ, MALLOC_PERTURB_="165", MALLOC_TOP_PAD_="33554432",
                     MALLOC_MMAP_THRESHOLD_="4096", STASH_TEST_PAD="x" * 100000))
check(len(plain) == len(TRACES) * len(CONFS), "a digest for every trace and configuration")
for a, b in zip(plain, moved):
    check(a == b, "same decisions with the host's memory moved: %s %s"
          % (os.path.basename(a.split()[0]), a.split()[1]))
# The digest sees a decision: another setting, another digest (and the policies differ).
other = digests(dict(os.environ), ["policy:stash,max_piece_size_mb:20"])
check(len(other) == len(TRACES) and all(o.split()[2] != p.split()[2]
                                        for o, p in zip(other, plain[0::2])),
      "another setting gives other digests")
check(all(a.split()[2] != b.split()[2] for a, b in zip(plain[0::2], plain[1::2])),
      "the two policies give other digests")
if failures:
    sys.exit("%d failed" % len(failures))
