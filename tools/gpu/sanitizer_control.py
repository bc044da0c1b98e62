#!/usr/bin/env python3
"""The positive control of run_sanitizer_gpu.sh: does compute-sanitizer see stash's memory?

CuPy on stash (policy:stash): a 64 MiB array is written (mapped memory: no error expected),
freed, and stash's cache emptied, which unmaps and releases the physical memory at the end of
the large arena; then a kernel writes to the same address again. Under
`compute-sanitizer --tool memcheck` the second write must be reported (an invalid __global__
write: the address lies in stash's reserved but now unmapped range) and the first must not -
so that "0 errors" on a run means the accesses went to memory stash had mapped. Run without
the sanitizer, the second write ends the process with an illegal-address error.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import cupy  # noqa: E402
import stash  # noqa: E402

stash.cupy.install("policy:stash")
n = 64 << 20
a = cupy.empty(n, dtype=cupy.uint8)
p = a.data.ptr
a.fill(1)
cupy.cuda.runtime.deviceSynchronize()
print("first write done (mapped): sum", int(a[: 1 << 20].sum()), flush=True)
del a
stash.empty_cache()
print("reserved after empty_cache:", stash.memory_reserved(), flush=True)
print("MARKER: writing to the released address", hex(p), flush=True)
m = 4096  # a few bytes suffice (the sanitizer reports each thread's access)
mem = cupy.cuda.UnownedMemory(p, m, None, cupy.cuda.Device().id)  # the device: p is unmapped
b = cupy.ndarray((m,), cupy.uint8, cupy.cuda.MemoryPointer(mem, 0))
b.fill(2)
cupy.cuda.runtime.deviceSynchronize()
print("second write returned (not expected)", flush=True)
sys.exit(0)
