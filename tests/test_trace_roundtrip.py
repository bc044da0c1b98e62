#!/usr/bin/env python3
"""stash-replay's two inputs agree, and agree with PyTorch:

- a program on libstash (the simulated device, through the plug-in entry points) writes its
  calls twice: STASH_TRACE's RMM CSV log, and a snapshot (stash.dump_snapshot with
  record_memory_history on); replaying either gives the same figures under every policy;
- PyTorch's own snapshot (data/traces/resnet50_train.snapshot.pickle.gz), replayed under
  policy:pytorch, reserves exactly the bytes of the segments PyTorch held when it was taken,
  in as many segments.

  test_trace_roundtrip.py STASH_REPLAY LIBSTASH PYTHON_DIR DATA_DIR
"""
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap

REPLAY, LIB, PYDIR, DATA = (os.path.abspath(a) for a in sys.argv[1:5])
CONFS = ["policy:stash", "policy:pytorch", "policy:pytorch,expandable_segments:True"]
failures = []


def check(cond, what):
    print("%-60s %s" % (what, "ok" if cond else "FAIL"))
    if not cond:
        failures.append(what)


def replay(path):
    args = [REPLAY, "--json"]
    for c in CONFS:
        args += ["--conf", c]
    p = subprocess.run(args + [path], capture_output=True, text=True, timeout=300)
    if p.returncode:
        print(p.stderr)
        return {}
    return {o["conf"]: o for o in map(json.loads, p.stdout.splitlines())}


with tempfile.TemporaryDirectory() as tmp:
    csv, snap = os.path.join(tmp, "log.csv"), os.path.join(tmp, "snap.pickle")
    workload = textwrap.dedent("""
        import random, stash
        L = stash._lib.lib()
        stash.record_memory_history(max_entries=1000000)
        rnd, live = random.Random(5), []
        for i in range(20000):
            if live and rnd.random() < 0.48:
                p = live.pop(rnd.randrange(len(live)))
                L.stash_torch_free(p, 0, 0, None)
            else:
                size = rnd.choice([rnd.randrange(1, 1 << 20), rnd.randrange(1 << 20, 64 << 20),
                                   rnd.randrange(256 << 20, 700 << 20) if rnd.random() < 0.02 else 512])
                live.append(L.stash_torch_malloc(size, 0, None))
        stash.dump_snapshot(%r)
    """ % snap)
    env = dict(os.environ, STASH_PROVIDER="sim", STASH_LIBRARY=LIB, PYTHONPATH=PYDIR,
               STASH_TRACE=csv, STASH_SIM_CAPACITY="64GiB")
    env.pop("STASH_CONF", None)
    p = subprocess.run([sys.executable, "-c", workload], env=env, capture_output=True, text=True,
                       timeout=300)
    check(p.returncode == 0, "workload ran (log and snapshot written)")
    if p.returncode:
        print(p.stdout + p.stderr)
    else:
        a, b = replay(csv), replay(snap)
        check(len(a) == len(CONFS) and len(b) == len(CONFS), "both replay")
        for c in CONFS:
            x, y = a.get(c, {}), b.get(c, {})
            same = all(x.get(k) == y.get(k) and x.get(k) is not None for k in
                       ("events", "peak_live_bytes", "peak_reserved_bytes", "peak_allocated_bytes",
                        "device_allocs", "device_frees", "ooms"))
            check(same, "CSV log and snapshot give the same figures (%s)" % c)
            if not same:
                print("   csv: %s\n   snapshot: %s" % (x, y))

real = pickle.load(gzip.open(os.path.join(DATA, "traces", "resnet50_train.snapshot.pickle.gz")))
held = sum(s["total_size"] for s in real["segments"])
r = replay(os.path.join(DATA, "traces", "resnet50_train.snapshot.pickle.gz")).get("policy:pytorch", {})
check(r.get("peak_reserved_bytes") == held,
      "PyTorch's snapshot replayed: reserved = its segments (%s vs %d)" % (r.get("peak_reserved_bytes"), held))
check(r.get("device_allocs") == len(real["segments"]),
      "... in as many segments (%s vs %d)" % (r.get("device_allocs"), len(real["segments"])))
print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
