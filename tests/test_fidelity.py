#!/usr/bin/env python3
"""Fidelity: policy:pytorch replays each shared trace under PyTorch's four settings and must
give exactly the peak reserved bytes, peak allocated bytes and device allocations that
PyTorch 2.11's own allocator gave on the H200 (data/traces/anchors.json).

  test_fidelity.py STASH_REPLAY DATA_DIR [TRACE_NAME...]

With STASH_FIDELITY_PROVIDER=cuda the replays run on a real GPU (exit 77 where there is
none); a setting under which PyTorch reserved more than that GPU holds (bert_varlen_train
under max_split_size_mb:200 reserved 102.9 GB of the H200's 140 GB) cannot be replayed on a
smaller card, and is reported as skipped there, not compared.
"""
import ctypes
import json
import os
import subprocess
import sys


def device_total_bytes():
    """The first GPU's memory in bytes (cuDeviceTotalMem), or None if the driver says nothing."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, total = ctypes.c_int(0), ctypes.c_size_t(0)
        if cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), 0) or \
                cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev):
            return None
        return total.value
    except (OSError, AttributeError):
        return None


def main():
    replay, data = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3:])
    provider = os.environ.get("STASH_FIDELITY_PROVIDER", "sim")
    if provider == "cuda":
        probe = subprocess.run([replay, "--provider", "cuda", "--json", "--conf", "policy:pytorch",
                                "/dev/null"], capture_output=True, text=True)
        if "--provider cuda:" in probe.stderr:
            print("skipped: " + probe.stderr.strip())
            return 77
    total = device_total_bytes() if provider == "cuda" else None
    anchors = json.load(open(os.path.join(data, "traces", "anchors.json")))
    failures = 0
    rows = 0
    skipped = 0
    for name, t in sorted(anchors.items()):
        if only and name not in only:
            continue
        settings = []
        for s, want in t["pytorch"].items():
            if total is not None and want["peak_reserved_bytes"] > total:
                # what this GPU cannot hold is not replayed on it
                print("%-22s %-28s skipped: PyTorch reserved %d bytes, this GPU holds %d" % (
                    name, s or "(default)", want["peak_reserved_bytes"], total))
                skipped += 1
            else:
                settings.append(s)
        confs = ["policy:pytorch" + ("," + s if s else "") for s in settings]
        path = os.path.join(data, "traces", t["file"])
        # PyTorch's figures come from one fresh process per setting. On a GPU the driver's
        # address layout carries over from one replay to the next, so each setting gets its
        # own process there too; the simulated device starts afresh for each anyway.
        groups = [[c] for c in confs] if provider == "cuda" else [confs]
        got, failed = [], False
        for group in groups:
            cmd = [replay, "--json", "--provider", provider]
            for c in group:
                cmd += ["--conf", c]
            p = subprocess.run(cmd + [path], capture_output=True, text=True)
            if p.returncode != 0:
                print("%s: stash-replay failed (%d): %s" % (name, p.returncode, p.stderr.strip()))
                failed = True
                break
            got += [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        if failed:
            failures += len(settings)
            continue
        if len(got) != len(settings):
            print("%s: %d results for %d settings" % (name, len(got), len(settings)))
            failures += 1
            continue
        for setting, conf, g in zip(settings, confs, got):
            rows += 1
            # the driver time modelled (simulated) or measured (a GPU); the calls of the second
            # half counted on both
            modeled, measured = g["modeled_driver_us"], g.get("measured_driver_us")
            late = [g[k] for k in ("device_allocs_second_half", "device_frees_second_half")]
            if (provider == "sim") != (modeled is not None) or \
                    (provider != "sim") != (measured is not None) or \
                    any(not isinstance(v, int) for v in late):
                print("%s %s: driver time %s / %s, late calls %s on provider %s" % (
                    name, conf, modeled, measured, late, provider))
                failures += 1
            want = t["pytorch"][setting]
            assert g["conf"] == conf
            if g["events"] != t["events"] or g["peak_live_bytes"] != t["peak_live_bytes"]:
                print("%s: trace read wrong: %d events, peak live %d" % (name, g["events"], g["peak_live_bytes"]))
                failures += 1
            diffs = [(k, g[k], want[k]) for k in ("peak_reserved_bytes", "peak_allocated_bytes", "device_allocs")
                     if g[k] != want[k]]
            status = "exact" if not diffs else "DIFFERS " + ", ".join("%s %d (PyTorch %d)" % d for d in diffs)
            print("%-22s %-28s %s" % (name, setting or "(default)", status))
            failures += bool(diffs)
    print("%d rows on %s, %d differ%s" % (rows, provider, failures,
                                          ", %d skipped (larger than the GPU)" % skipped if skipped else ""))
    return 1 if failures or rows == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
