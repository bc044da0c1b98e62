#!/usr/bin/env python3
"""torch.cuda.MemPool on stash (policy:stash): allocations under use_mem_pool go to a pool of
their own; what PyTorch 2.11 does with a plug-in allocator. Prints each step; exit 0 if all
held."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402
import stash  # noqa: E402

stash.torch.install("policy:stash")
try:
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
except Exception as e:  # noqa: BLE001
    print("MemPool failed:", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    sys.exit(2)
print("pools:", stash.torch.graph_pools())
b = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
print("a in the pool, b outside, different memory:", a.data_ptr() != b.data_ptr())
del a
torch.cuda.empty_cache()
print("after del a + empty_cache:", stash.torch.graph_pools())
del pool
torch.cuda.empty_cache()
print("after del pool + empty_cache:", stash.torch.graph_pools())
