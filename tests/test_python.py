#!/usr/bin/env python3
"""The plug-in entry points (through ctypes) and the Python package, on the simulated
provider, without a GPU, PyTorch or CuPy; and the snapshot writer's structure against a
real PyTorch snapshot.

  test_python.py LIBSTASH PYTHON_DIR DATA_DIR

Each case runs in a fresh Python process (the default heaps are process-wide and read the
environment once), with STASH_PROVIDER=sim and STASH_LIBRARY=LIBSTASH.
"""
import gzip
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap

LIB = PYDIR = DATA = None
failures = []


def run(code, conf=None, env_extra=None):
    env = dict(os.environ)
    env.update({"STASH_PROVIDER": "sim", "STASH_LIBRARY": LIB, "PYTHONPATH": PYDIR,
                "STASH_SIM_CAPACITY": "8GiB", "STASH_TORCH_NULL_ON_FAILURE": "1"})
    env.pop("STASH_CONF", None)
    if conf is not None:
        env["STASH_CONF"] = conf
    env.update(env_extra or {})
    env = {k: v for k, v in env.items() if v != ""}
    prelude = textwrap.dedent("""
        import ctypes, json, os, pickle, sys
        import stash
        L = stash._lib.lib()
        MiB = 1 << 20
        def fail(msg):
            print("FAIL: " + msg); sys.exit(1)
        def eq(a, b, what):
            if a != b: fail("%s: %r != %r" % (what, a, b))
    """)
    p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def case(name, code, conf=None, expect_stderr=None):
    rc, out, err = run(code, conf)
    ok = rc == 0 and (expect_stderr is None or expect_stderr in err)
    print("%-48s %s" % (name, "ok" if ok else "FAIL"))
    if not ok:
        failures.append(name)
        sys.stdout.write(out + err)


def main():
    global LIB, PYDIR, DATA
    LIB, PYDIR, DATA = (os.path.abspath(a) for a in sys.argv[1:4])

    case("exports: malloc, free, stats follow", """
        p = L.stash_torch_malloc(1000, 0, None)
        q = L.stash_torch_malloc(3 * MiB, 0, ctypes.c_void_p(0x1234))
        if not p or not q or p % 512 or q % 512: fail("pointers %r %r" % (p, q))
        eq(stash.memory_allocated(0), 1024 + 3 * MiB, "allocated")
        for d in (None, "cuda:0", "cuda"):
            eq(stash.memory_allocated(d), 1024 + 3 * MiB, "allocated, device %r" % (d,))
        eq(stash.memory_stats(0)["allocation.all.current"], 2, "allocations")
        L.stash_torch_free(q, 3 * MiB, 0, ctypes.c_void_p(0x1234))
        L.stash_torch_free(p, 1000, 0, None)
        eq(stash.memory_allocated(), 0, "allocated after free")
        eq(stash.max_memory_allocated(), 1024 + 3 * MiB, "peak")
        stash.reset_peak_memory_stats()
        eq(stash.max_memory_allocated(), 0, "peak after reset")
        r = stash.memory_reserved()
        if r <= 0: fail("reserved %d" % r)
        stash.empty_cache()                       # = the reset hook
        eq(stash.memory_reserved(), 0, "reserved after empty_cache")
        free, total = stash.mem_get_info()
        eq(total, 8 << 30, "total")
        eq(free, 8 << 30, "free once empty")
    """)

    case("exports: bad pointers and sizes are refused", """
        eq(L.stash_torch_malloc(1 << 62, 0, None), None, "huge malloc")
        if "out of memory" not in stash.last_error(): fail("message: " + stash.last_error())
        eq(L.stash_torch_malloc(-5, 0, None), None, "negative size")
        eq(L.stash_torch_malloc(1000, 7, None), None, "no device 7")
        if "device 7" not in stash.last_error(): fail("message: " + stash.last_error())
        L.stash_torch_free(0x1000, 512, 0, None)    # reported on stderr, nothing lost
        L.stash_torch_record_stream(0x1000, None)
        eq(stash.memory_stats()["allocation.all.current"], 0, "no allocation")
    """, expect_stderr="is not a live allocation")

    rc, out, err = run("""
        L.stash_torch_malloc(1 << 62, 0, None)
        print("not reached")
    """, env_extra={"STASH_TORCH_NULL_ON_FAILURE": ""})
    ok = rc != 0 and "not reached" not in out and "PyTorch cannot be told" in err and "out of memory" in err
    print("%-48s %s" % ("exports: a failed PyTorch allocation stops", "ok" if ok else "FAIL"))
    if not ok:
        failures.append("torch malloc abort")
        sys.stdout.write(out + err)

    case("exports: memory fraction, record_stream, base", """
        L.stash_torch_set_memory_fraction(0.25, 0)     # 2 GiB of the 8
        eq(L.stash_torch_malloc(3 << 30, 0, None), None, "over the fraction")
        if "fraction" not in stash.last_error(): fail("message: " + stash.last_error())
        p = L.stash_torch_malloc(1 << 30, 0, None)
        if not p: fail("1 GiB under the fraction: " + stash.last_error())
        L.stash_torch_record_stream(p, ctypes.c_void_p(0x99))
        L.stash_torch_free(p, 1 << 30, 0, None)
        s = stash.memory_stats()
        eq(s["active_bytes.all.current"] >= 1 << 30, True, "pending until the stream is done")
        n = ctypes.c_size_t(7)
        eq(L.stash_torch_base_alloc(ctypes.c_void_p(0x5000), ctypes.byref(n)), 0x5000, "base")
        L.stash_torch_init(1)
    """)

    case("exports: CuPy's malloc and free", """
        p = L.stash_cupy_malloc(None, 5 * MiB, 0)
        if not p: fail("cupy malloc")
        eq(stash.memory_allocated(), 5 * MiB, "allocated")
        L.stash_cupy_free(None, p, 0)
        eq(stash.memory_allocated(), 0, "freed")
    """)

    case("STASH_CONF configures the heaps (policy:pytorch)", """
        p = L.stash_torch_malloc(1000, 0, None)
        eq(stash.memory_reserved(), 2 * MiB, "a 2 MiB small segment, as PyTorch")
        eq(stash.snapshot()["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"],
           "policy:pytorch,max_split_size_mb:100", "conf in the snapshot")
        eq(stash.snapshot()["allocator_settings"]["max_split_size"], 100 * MiB, "max_split_size")
        L.stash_torch_free(p, 1000, 0, None)
    """, conf="policy:pytorch,max_split_size_mb:100")

    case("a bad STASH_CONF is a clear error", """
        try:
            stash.memory_allocated()
        except RuntimeError as e:
            if "expandable_segments" not in str(e): fail("message: %s" % e)
        else:
            fail("no error")
    """, conf="expandable_segments:True")

    case("memory_summary is PyTorch's table", """
        p = L.stash_torch_malloc(3 * MiB, 0, None)
        t = stash.memory_summary()
        for needle in ("Allocated memory", "GPU reserved memory", "device ID 0"):
            if needle not in t: fail("%r not in summary" % needle)
        if len(stash.memory_summary(abbreviated=True)) >= len(t): fail("abbreviated")
    """)

    case("memory_account and explain say where the reserved bytes are", """
        q = L.stash_torch_malloc(1000, 0, None)       # a 1024-byte block: the small arena
        p = L.stash_torch_malloc(3 * MiB, 0, None)    # the large arena grows by 6 MiB
        acc = stash.memory_account()
        big, small = acc["large_pool"], acc["small_pool"]
        eq(big["reserved"], 6 * MiB, "large reserved")
        eq(big["live"], 3 * MiB, "large live")
        eq((big["ends"], big["nends"], big["holes"]), (3 * MiB, 1, 0), "large free end")
        eq((small["live"], small["rounding"]), (1000, 24), "small live and rounding")
        for pool in (big, small):
            eq(sum(pool[k] for k in ("live", "rounding", "pending_free", "lent", "holes", "ends")),
               pool["reserved"], "the terms add up")
        eq(big["reserved"] + small["reserved"], stash.memory_reserved(), "= memory_reserved()")
        eq(stash.explain().splitlines()[1],
           "large pool: 6.0 MiB reserved in 1 segment = 3.0 live + 0.0 rounding + 0.0 pending "
           "free + 0.0 lent to stitched blocks (0.0 asked for) + 0.0 in 0 holes (the largest "
           "0.0) + 3.0 free at 1 segment end", "explain")
        L.stash_torch_free(p, 0, 0, None)
        L.stash_torch_free(q, 0, 0, None)
        stash.empty_cache()
        eq(stash.explain(), "", "no memory held: nothing to say")
        try:
            stash.memory_account(5)
        except RuntimeError as e:
            if "device 5" not in str(e): fail("message: %s" % e)
        else:
            fail("no error for device 5")
    """)

    case("record_memory_history and the ring buffer", """
        stash.record_memory_history(max_entries=5)
        ps = [L.stash_torch_malloc(k * MiB + 1, 0, None) for k in range(1, 4)]
        for p in ps: L.stash_torch_free(p, 0, 0, None)
        tr = stash.snapshot()["device_traces"][0]
        eq(len(tr), 5, "the newest 5 kept")
        eq([t["action"] for t in tr],
           ["free_completed", "free_requested", "free_completed", "free_requested", "free_completed"],
           "actions, oldest first")
        eq(tr[-1]["addr"], ps[2], "address")
        eq(tr[-1]["size"], 3 * MiB + 1, "requested size")
        if not all(tr[i]["time_us"] <= tr[i + 1]["time_us"] for i in range(4)): fail("times")
        stash.record_memory_history(enabled=None)
        eq(stash.snapshot()["device_traces"][0], [], "stopped and cleared")
        stash.record_memory_history(max_entries=100)
        eq(L.stash_torch_malloc(1 << 62, 0, None), None, "oom")
        oom = [t for t in stash.snapshot()["device_traces"][0] if t["action"] == "oom"]
        eq(len(oom), 1, "an oom entry")
        eq("device_free" in oom[0] and "addr" not in oom[0], True, "oom has device_free")
    """)

    real = pickle.load(gzip.open(os.path.join(DATA, "traces", "resnet50_train.snapshot.pickle.gz")))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snap.pickle")
        for conf in ("policy:stash", "policy:pytorch"):
            rc, out, err = run("""
                stash.record_memory_history()
                keep = [L.stash_torch_malloc(s, 0, None) for s in (1000, 3 * MiB, 50 * MiB, 400 * MiB)]
                gone = L.stash_torch_malloc(7 * MiB, 0, None)
                L.stash_torch_free(gone, 0, 0, None)
                p = L.stash_torch_malloc(2 * MiB, 0, None)
                L.stash_torch_record_stream(p, ctypes.c_void_p(0x77))
                L.stash_torch_free(p, 0, 0, None)     # pending: another stream uses it
                stash.dump_snapshot(sys.argv[1] if len(sys.argv) > 1 else %r)
            """ % path, conf=conf)
            ok = rc == 0
            if ok:
                mine = pickle.load(open(path, "rb"))
                problems = compare(real, mine)
                ok = not problems
                if problems:
                    out += "\n".join(problems)
            print("%-48s %s" % ("snapshot has PyTorch's structure (%s)" % conf, "ok" if ok else "FAIL"))
            if not ok:
                failures.append("snapshot " + conf)
                sys.stdout.write(out + err)

    case("a CUDA graph's pool: its own heap, listed", """
        eq(stash.torch.graph_pools(), [], "no pool yet")
        L.stash_torch_begin_allocate_to_pool(0, 3, 0, None)     # torch.cuda.graph's hooks
        p = L.stash_torch_malloc(50 * MiB, 0, None)
        L.stash_torch_end_allocate_to_pool(0, 3, 0)
        q = L.stash_torch_malloc(1000, 0, None)
        pools = stash.torch.graph_pools()
        eq(len(pools), 1, "pools")
        eq((pools[0]["device"], pools[0]["allocated_bytes"], pools[0]["active"]),
           (0, 50 * MiB, 1), "the pool's block")
        if pools[0]["reserved_bytes"] < 50 * MiB: fail("pool reserved %r" % pools[0])
        eq(stash.memory_allocated(0), 1024, "the default heap has the other block only")
        snap = stash.snapshot()
        mine = [seg for seg in snap["segments"] if seg["segment_pool_id"] == (3, 0)]
        eq(sum(seg["allocated_size"] for seg in mine), 50 * MiB, "the pool's segments in the snapshot")
        eq(sum(seg["allocated_size"] for seg in snap["segments"]), 50 * MiB + 1024, "all segments")
        L.stash_torch_free(p, 50 * MiB, 0, None)
        L.stash_torch_release_pool(0, 3, 0)
        stash.empty_cache()
        eq(stash.torch.graph_pools(), [], "given back at empty_cache")
        L.stash_torch_free(q, 1000, 0, None)
    """)

    case("the package imports without PyTorch or CuPy", """
        for m in ("torch", "cupy"):
            if m in sys.modules: fail(m + " was imported")
        try:
            stash.torch.install()
        except ImportError:
            pass
        else:
            if "torch" not in sys.modules: fail("install without torch")
    """)

    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


def compare(real, mine):
    """The keys and value types of every level of mine match those of a real snapshot, and
    mine is consistent in itself (sizes add up, states are PyTorch's)."""
    out = []

    def keys(what, a, b, optional=()):
        missing = set(a) - set(b) - set(optional)
        extra = set(b) - set(a)
        if missing or extra:
            out.append("%s: missing %s, extra %s" % (what, sorted(missing), sorted(extra)))
        for k in set(a) & set(b):
            ta, tb = type(a[k]), type(b[k])
            if ta != tb and not (ta in (int, float) and tb in (int, float)):
                out.append("%s.%s: %s, not %s" % (what, k, tb.__name__, ta.__name__))

    keys("snapshot", real, mine)
    rseg, rblk = real["segments"][0], real["segments"][0]["blocks"][0]
    if not mine["segments"]:
        out.append("no segments")
    for s in mine["segments"]:
        keys("segment", rseg, s)
        if s["total_size"] != sum(b["size"] for b in s["blocks"]):
            out.append("segment 0x%x: blocks do not add up" % s["address"])
        for b in s["blocks"]:
            keys("block", rblk, b)
            if b["state"] not in ("active_allocated", "active_pending_free", "inactive"):
                out.append("block state %r" % b["state"])
    states = {b["state"] for s in mine["segments"] for b in s["blocks"]}
    if "active_pending_free" not in states:
        out.append("the pending block is not active_pending_free")
    rtr = real["device_traces"][0]
    by_action = {t["action"]: t for t in rtr}
    actions = set()
    for t in mine["device_traces"][0]:
        actions.add(t["action"])
        ref = by_action.get(t["action"], by_action["alloc"])
        keys("trace entry (%s)" % t["action"], ref, t)
    for a in ("alloc", "free_requested", "free_completed"):
        if a not in actions:
            out.append("no %s entry" % a)
    if not actions & {"segment_alloc", "segment_map"}:
        out.append("no segment entry")
    keys("allocator_settings", real["allocator_settings"], mine["allocator_settings"])
    return out


if __name__ == "__main__":
    sys.exit(main())
