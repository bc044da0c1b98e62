#!/usr/bin/env python3
"""What a CUDA graph captured with PyTorch does on an allocator:
graph_probe.py ALLOCATOR [--empty-cache]

ALLOCATOR: "torch" (PyTorch's own), or a STASH_CONF string ("policy:stash", "policy:pytorch")
for stash through its PyTorch plug-in. --empty-cache: torch.cuda.empty_cache() between the
capture and the replay (an allocator without a private pool per graph may then give back
memory the graph replays into).

A graph is captured whose work makes 64 MiB temporaries and frees them inside the capture;
then, outside it, a 64 MiB tensor filled with 7 is allocated, the graph replayed, and the
tensor read back. A graph's replay writes to the addresses its temporaries had at capture, so
an allocator that hands such an address to a tensor made after the capture (PyTorch's own
keeps a private pool per graph for this) lets the replay overwrite that tensor. Prints one
line per check and "RESULT ..." last; the exit status is 0 when the tensor is intact.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

which = sys.argv[1] if len(sys.argv) > 1 else "torch"
empty = "--empty-cache" in sys.argv[2:]
if which != "torch":
    import stash  # noqa: E402
    stash.torch.install(which)

n = 16 << 20  # floats: 64 MiB
x = torch.randn(n, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):  # warm-up on a side stream, as PyTorch's documentation asks
    for _ in range(2):
        y = ((x * 2).relu() + 1).sum()
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()

g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        t1 = x * 2          # temporaries of 64 MiB, freed inside the capture
        t2 = t1.relu()
        del t1
        t3 = t2 + 1
        del t2
        out = t3.sum()
        del t3
except Exception as e:  # noqa: BLE001
    print("capture failed:", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    print("RESULT capture-error")
    sys.exit(2)
torch.cuda.synchronize()
print("captured")

if empty:
    torch.cuda.empty_cache()
    print("emptied the cache")
z = torch.full((n,), 7.0, device="cuda")  # made after the capture, outside any pool
torch.cuda.synchronize()
g.replay()
torch.cuda.synchronize()
bad = int((z != 7.0).sum().item())
expect = float(((x * 2).relu() + 1).sum().item())
print("tensor made after capture at 0x%x: %d of %d floats overwritten by the replay" %
      (z.data_ptr(), bad, n))
print("graph output %.6g, eager %.6g" % (out.item(), expect))
print("RESULT", "corrupted" if bad else "intact")
sys.exit(1 if bad else 0)
