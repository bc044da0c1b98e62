#!/usr/bin/env python3
"""stash under PyTorch on a GPU: the hooks reach stash (empty_cache, memory fraction,
record_stream, a CUDA graph's private pool under each policy: its memory grown during the
capture, kept through empty_cache, never handed to a tensor made after it, given back once the
graph is gone; a capture on two streams, whose cross-stream frees record no event in the
capture), statistics follow the tensors, and installing too late is a clear error.
Exits 77 (CTest's skip) without PyTorch or a GPU.

  test_torch_gpu.py LIBSTASH PYTHON_DIR
"""
import os
import subprocess
import sys
import textwrap

LIB, PYDIR = (os.path.abspath(a) for a in sys.argv[1:3])


def run(code):
    env = dict(os.environ, STASH_LIBRARY=LIB, PYTHONPATH=PYDIR, STASH_PROVIDER="cuda")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                       text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


probe = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                       capture_output=True)
if probe.returncode != 0:
    print("skipped: no PyTorch with a GPU")
    sys.exit(77)

failures = 0
cases = {
    "hooks and statistics": """
        import os, torch, stash
        stash.torch.install("policy:stash")
        MiB = 1 << 20
        x = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")
        assert stash.memory_allocated() == 300 * MiB, stash.memory_allocated()
        r = stash.memory_reserved()
        del x
        assert stash.memory_allocated() == 0
        torch.cuda.empty_cache()                      # the reset hook
        assert stash.memory_reserved() < r, (stash.memory_reserved(), r)
        free, total = stash.mem_get_info()
        assert (free, total) == torch.cuda.mem_get_info(), ((free, total), torch.cuda.mem_get_info())
        torch.cuda.set_per_process_memory_fraction(0.01)   # the fraction hook: ~1.4 GB
        L = stash._lib.lib()
        os.environ["STASH_TORCH_NULL_ON_FAILURE"] = "1"
        assert L.stash_torch_malloc(4 << 30, 0, None) is None, "the fraction did not reach stash"
        assert "fraction" in stash.last_error(), stash.last_error()
        torch.cuda.set_per_process_memory_fraction(1.0)
        s = torch.cuda.Stream()
        y = torch.ones(50 * MiB, dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(s):
            z = y * 2
        y.record_stream(s)                            # the record_stream hook
        del y
        st = stash.memory_stats()
        assert st["active_bytes.all.current"] > st["allocated_bytes.all.current"], st
        s.synchronize()
        assert int(z.sum().item()) == 2 * 50 * MiB
        print("ok")
    """,
    "out of memory under PyTorch stops with the reason": """
        import torch, stash
        stash.torch.install("policy:stash")
        torch.cuda.set_per_process_memory_fraction(0.01)
        x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
        print("not reached: got", hex(x.data_ptr()))
    """,
    "installing after PyTorch allocated is an error": """
        import torch, stash
        torch.empty(10, device="cuda")
        try:
            stash.torch.install()
        except stash.torch.InstallError as e:
            assert "before PyTorch's first CUDA allocation" in str(e), e
            print("ok")
        else:
            raise AssertionError("no error")
    """,
}
GRAPH = """
    import torch, stash
    stash.torch.install(%r)
    n = 16 << 20                                   # floats: 64 MiB temporaries
    x = torch.randn(n, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                      # the pool hooks; its memory grown in capture
        t = (x * 2).relu() + 1
        out = t.sum()
        del t                                      # freed inside the capture
    pools = stash.torch.graph_pools()
    assert len(pools) == 1 and pools[0]["active"] >= 1, pools
    a = stash.memory_allocated()                   # x (and PyTorch's small tensors), not t
    assert n * 4 <= a < n * 4 + (1 << 20), a
    torch.cuda.empty_cache()                       # must not give back what the graph uses
    assert stash.torch.graph_pools()[0]["reserved_bytes"] == pools[0]["reserved_bytes"]
    z = torch.full((n,), 7.0, device="cuda")       # made after: never the graph's memory
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert int((z != 7.0).sum().item()) == 0, "the replay overwrote a tensor made after it"
    want = ((x * 2).relu() + 1).sum().item()
    assert abs(out.item() - want) <= 1e-4 * abs(want), (out.item(), want)
    del g, out                                     # the graph released, its output freed
    torch.cuda.empty_cache()
    assert stash.torch.graph_pools() == [], stash.torch.graph_pools()
    print("ok")
"""
GRAPH_STREAMS = """
    import torch, stash
    stash.torch.install(%r)
    n = 16 << 20
    x = torch.randn(n, device="cuda")
    side = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                      # a capture on two streams
        cs = torch.cuda.current_stream()
        side.wait_stream(cs)
        with torch.cuda.stream(side):
            a = x * 2                              # allocated on the side stream
        cs.wait_stream(side)
        a.record_stream(cs)
        b = a + 1
        del a                                      # freed in the capture, used on both
        c = torch.empty_like(b)
        c.copy_(b * 3)
        out = c.sum()
        del b, c
    z = torch.full((n,), 7.0, device="cuda")
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert int((z != 7.0).sum().item()) == 0
    want = ((x * 2 + 1) * 3).sum().item()
    assert abs(out.item() - want) <= 1e-4 * abs(want), (out.item(), want)
    del g, out
    torch.cuda.empty_cache()
    assert stash.torch.graph_pools() == [], stash.torch.graph_pools()
    print("ok")
"""
for conf in ("policy:stash", "policy:pytorch", "policy:pytorch,expandable_segments:True"):
    cases["a CUDA graph's memory is its own (%s)" % conf] = GRAPH % conf
    cases["a graph captured on two streams (%s)" % conf] = GRAPH_STREAMS % conf
for name, code in cases.items():
    rc, out = run(code)
    if name.startswith("out of memory"):
        ok = rc != 0 and "not reached" not in out and "PyTorch cannot be told" in out and "fraction" in out
    else:
        ok = rc == 0 and out.strip().endswith("ok")
    print("%-50s %s" % (name, "ok" if ok else "FAIL"))
    if not ok:
        failures += 1
        print(out[-3000:])
sys.exit(1 if failures else 0)
