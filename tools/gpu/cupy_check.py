#!/usr/bin/env python3
"""A CuPy workload (array arithmetic, reductions, FFT, a matrix product, sorting) under
CuPy's own memory pool or under stash; prints one JSON line with a digest of every result
and the peak memory, so that two runs can be compared exactly.

  cupy_check.py --alloc cupy|stash [--conf CONF]
"""
import argparse
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
ap = argparse.ArgumentParser()
ap.add_argument("--alloc", required=True, choices=["cupy", "stash"])
ap.add_argument("--conf", default=None)
args = ap.parse_args()

import cupy as cp  # noqa: E402

if args.alloc == "stash":
    import stash  # noqa: E402
    stash.cupy.install(args.conf)

digests = {}


def keep(name, a):
    digests[name] = hashlib.sha256(cp.asnumpy(a).tobytes()).hexdigest()[:16]


rng = cp.random.RandomState(7)
for rep in range(3):  # allocate, free and allocate again: cached memory is reused
    x = rng.standard_normal((4096, 4096), dtype=cp.float32)
    y = rng.standard_normal((4096, 4096), dtype=cp.float32)
    keep("add%d" % rep, x * 2 + y)
    keep("sum%d" % rep, x.sum(axis=0))
    keep("max%d" % rep, cp.max(y, axis=1))
    keep("matmul%d" % rep, x @ y)
    keep("fft%d" % rep, cp.fft.fft2(x[:1024, :1024]))
    keep("sort%d" % rep, cp.sort(y.ravel()[: 1 << 20]))
    big = [cp.ones(1 << k, dtype=cp.uint8) for k in range(10, 31, 4)]  # 1 KiB .. 1 GiB
    keep("sizes%d" % rep, cp.asarray([int(b.sum()) for b in big]))
    del x, y, big
cp.cuda.Device().synchronize()
out = {"alloc": args.alloc, "digests": digests}
if args.alloc == "stash":
    out["max_reserved"] = stash.max_memory_reserved(0)
    out["allocations"] = stash.memory_stats(0)["allocation.all.allocated"]
else:
    out["pool_total_bytes"] = cp.get_default_memory_pool().total_bytes()
print(json.dumps(out))
