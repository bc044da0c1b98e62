#!/usr/bin/env python3
"""A CUDA graph captured on two streams, on an allocator: graph_streams_probe.py ALLOCATOR

ALLOCATOR: "torch" or a STASH_CONF string (stash through its PyTorch plug-in). The capture
forks to a side stream, which allocates a 64 MiB temporary; the capture stream joins it, uses
the temporary (record_stream) and frees it; then the graph is replayed three times and its
output checked, with a tensor made after the capture checked for overwrites. Prints
"RESULT ..." last; exit 0 when all held.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

which = sys.argv[1] if len(sys.argv) > 1 else "torch"
if which != "torch":
    import stash  # noqa: E402
    stash.torch.install(which)

n = 16 << 20
x = torch.randn(n, device="cuda")
side = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        cs = torch.cuda.current_stream()
        side.wait_stream(cs)
        with torch.cuda.stream(side):
            a = x * 2                      # allocated on the side stream, in the capture
        cs.wait_stream(side)
        a.record_stream(cs)
        b = a + 1
        del a                              # freed in the capture, used on two streams
        c = torch.empty_like(b)            # may reuse a's memory once its uses are done
        c.copy_(b * 3)
        out = c.sum()
        del b, c
except Exception as e:  # noqa: BLE001
    print("capture failed:", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    print("RESULT capture-error")
    sys.exit(2)
torch.cuda.synchronize()
z = torch.full((n,), 7.0, device="cuda")
for _ in range(3):
    g.replay()
torch.cuda.synchronize()
want = ((x * 2 + 1) * 3).sum().item()
bad = int((z != 7.0).sum().item())
ok = bad == 0 and abs(out.item() - want) <= 1e-4 * abs(want)
print("overwritten floats:", bad, "output", out.item(), "want", want)
print("RESULT", "ok" if ok else "wrong")
sys.exit(0 if ok else 1)
