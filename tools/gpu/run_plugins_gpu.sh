#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for, or an H100 80GB - run on one in
# the thirty-sixth session, docs/results/gpu-h100-36.md): PyTorch and CuPy on stash. Builds stash, then trains
# ResNet-50 and GPT-2 for 20 steps with PyTorch's allocator and with stash under each
# setting (one process each), runs a CuPy workload on CuPy's pool and on stash, renders a
# stash snapshot with PyTorch's memory viewer, and writes $OUT/plugins/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/plugins
mkdir -p "$R"
. tools/gpu/build.sh
: > "$R/train.jsonl"
for m in resnet50 gpt2; do
  for run in "pytorch " "pytorch expandable_segments:True" "stash policy:pytorch" \
             "stash policy:pytorch,expandable_segments:True" "stash policy:stash"; do
    set -- $run
    timeout 300 python3 tools/gpu/train_compare.py --model $m --alloc $1 --conf "${2:-}" \
      >> "$R/train.jsonl" 2>> "$R/train.err" || echo "train $m $run: failed" | tee -a "$R/train.err"
  done
done
: > "$R/cupy.jsonl"
for a in cupy stash; do
  timeout 120 python3 tools/gpu/cupy_check.py --alloc $a >> "$R/cupy.jsonl" 2>> "$R/cupy.err" ||
    echo "cupy $a: failed" | tee -a "$R/cupy.err"
done
# A snapshot of stash under PyTorch, opened by PyTorch's own memory viewer code.
timeout 120 python3 - > "$R/viz.txt" 2>&1 <<'PY'
import os, sys, pickle
sys.path.insert(0, "python")
import torch, stash
stash.torch.install("policy:stash")
stash.record_memory_history()
xs = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 40, 300)]
y = torch.empty(10 << 20, device="cuda"); del y
stash.dump_snapshot(os.environ["OUT"] + "/plugins/stash_snapshot.pickle")
from torch.cuda import _memory_viz as viz
snap = pickle.load(open(os.environ["OUT"] + "/plugins/stash_snapshot.pickle", "rb"))
print(viz.segsum(snap)[:2000])
html = viz.trace_plot(snap)
open(os.environ["OUT"] + "/plugins/stash_trace_plot.html", "w").write(html)
print("trace_plot html bytes:", len(html))
print("torch.cuda.memory_allocated raises for the plug-in:", end=" ")
try:
    torch.cuda.memory_allocated(); print("no")
except Exception as e:
    print("yes (%s); stash.memory_allocated() = %d" % (type(e).__name__, stash.memory_allocated()))
PY
echo "viz: exit $?"
python3 - "$R" <<'PY' | tee "$R/summary.md"
import json, sys, os
R = sys.argv[1]
rows = [json.loads(l) for l in open(R + "/train.jsonl") if l.strip()]
by = {(r["model"], r["alloc"], r["conf"]): r for r in rows}
print("| model | setting | losses equal | peak reserved stash | peak reserved PyTorch | median step stash (ms) | median step PyTorch (ms) | time ratio |")
print("|---|---|---|---:|---:|---:|---:|---:|")
for m in ("resnet50", "gpt2"):
    for conf, ref in (("policy:pytorch", ""), ("policy:pytorch,expandable_segments:True", "expandable_segments:True"),
                      ("policy:stash", "")):
        s, p = by.get((m, "stash", conf)), by.get((m, "pytorch", ref))
        if not s or not p:
            print("| %s | %s | missing run | | | | | |" % (m, conf)); continue
        eq = s["losses"] == p["losses"]
        md = max(abs(a - b) for a, b in zip(s["losses"], p["losses"]))
        print("| %s | %s | %s | %d | %d | %.2f | %.2f | %.3f |" % (
            m, conf, "yes (20/20 identical)" if eq else "no (max diff %.3g)" % md, s["max_reserved"],
            p["max_reserved"], s["median_step_ms"], p["median_step_ms"], s["median_step_ms"] / p["median_step_ms"]))
c = [json.loads(l) for l in open(R + "/cupy.jsonl") if l.strip()]
if len(c) == 2:
    print("\nCuPy: %d results, identical on stash: %s (stash peak reserved %s)" % (
        len(c[0]["digests"]), c[0]["digests"] == c[1]["digests"], c[1].get("max_reserved")))
PY
