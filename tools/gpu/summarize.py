#!/usr/bin/env python3
"""Tables from run_gpu_checks.sh's results: GPU vs simulated vs PyTorch, per trace and setting."""
import json
import os
import sys

R = sys.argv[1]
anchors = json.load(open(os.path.join(os.path.dirname(__file__), "..", "..", "data", "traces", "anchors.json")))
rep = [json.loads(l) for l in open(os.path.join(R, "replays.jsonl")) if l.startswith("{")]
pt = [json.loads(l) for l in open(os.path.join(R, "pytorch.jsonl")) if l.startswith("{")]
keys = ("peak_reserved_bytes", "peak_allocated_bytes", "device_allocs")
print("| trace | setting | GPU peak reserved | GPU peak allocated | GPU device allocs | = sim | = PyTorch | ns/event GPU | ns/event sim | ns/event PyTorch (GPU) |")
print("|---|---|---|---|---|---|---|---|---|---|")
exact = 0
for name in ("resnet50_train", "gpt2_train", "bert_varlen_train", "gpt2_sidestream_train"):
    for setting in ("", "expandable_segments:True", "max_split_size_mb:200", "roundup_power2_divisions:4"):
        conf = "policy:pytorch" + ("," + setting if setting else "")
        g = [r for r in rep if r["trace"].startswith(name + ".") and r["conf"] == conf and r["provider"] == "cuda"]
        s = [r for r in rep if r["trace"].startswith(name + ".") and r["conf"] == conf and r["provider"] == "sim"]
        p = [r for r in pt if r["trace"].endswith("/" + name + ".csv") and r["conf"] == setting]
        if not g or not s:
            print("| %s | %s | missing |" % (name, setting or "(default)"))
            continue
        g, s = g[0], s[0]
        want = anchors[name]["pytorch"][setting]
        same_sim = all(g[k] == s[k] for k in keys)
        same_pt = all(g[k] == want[k] for k in keys)
        exact += same_sim and same_pt
        print("| %s | %s | %d | %d | %d | %s | %s | %.0f | %.0f | %s |" % (
            name, setting or "(default)", g["peak_reserved_bytes"], g["peak_allocated_bytes"],
            g["device_allocs"], "yes" if same_sim else "NO", "yes" if same_pt else "NO",
            g["ns_per_event"], s["ns_per_event"], "%.0f" % p[0]["ns_per_event"] if p else "-"))
print("\n%d/16 rows: GPU = simulated = PyTorch" % exact)
