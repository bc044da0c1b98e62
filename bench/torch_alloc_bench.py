#!/usr/bin/env python3
"""Cost of one tensor's allocation and free, seen from PyTorch, on its own allocator and on
stash (through CUDAPluggableAllocator). Needs a GPU; run once per allocator, each in a fresh
process (the allocator cannot change once CUDA memory exists):

  bench/torch_alloc_bench.py --alloc pytorch|stash [--conf CONF]

Prints one JSON line: median ns per torch.empty + del, over 15 repetitions of 20000 pairs,
for sizes 512 B, 64 KiB, 4 MiB and 64 MiB (all cached after the warm-up: no driver call).
"""
import argparse, json, os, statistics, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
ap = argparse.ArgumentParser()
ap.add_argument("--alloc", required=True, choices=["pytorch", "stash"])
ap.add_argument("--conf", default="")
args = ap.parse_args()
import torch  # noqa: E402
if args.alloc == "stash":
    import stash  # noqa: E402
    stash.torch.install(args.conf or None)
dev = torch.device("cuda", 0)
out = {"alloc": args.alloc, "conf": args.conf, "ns_per_pair": {}}
for size in (512, 64 << 10, 4 << 20, 64 << 20):
    for _ in range(2000):  # warm-up: the block is cached from here on
        x = torch.empty(size, dtype=torch.uint8, device=dev)
        del x
    reps = []
    for _ in range(15):
        t0 = time.perf_counter_ns()
        for _ in range(20000):
            x = torch.empty(size, dtype=torch.uint8, device=dev)
            del x
        reps.append((time.perf_counter_ns() - t0) / 20000)
    out["ns_per_pair"][str(size)] = round(statistics.median(reps), 1)
torch.cuda.synchronize()
print(json.dumps(out))
