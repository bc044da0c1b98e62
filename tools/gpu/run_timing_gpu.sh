#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for, or an H100 80GB - run on one in
# the thirty-sixth session, docs/results/gpu-h100-36.md; timings compare only on one card): step times of ResNet-50
# and GPT-2 under PyTorch's allocator and stash, interleaved (A B A B ...) so that drifts of
# the machine fall on both; ROUNDS rounds (default 2) of STEPS steps (default 30) for each
# model in MODELS (default "resnet50 gpt2"); then the cost of one tensor alloc+free
# (bench/torch_alloc_bench.py).
# Summary (medians of the per-run medians, and the spread of each side's runs) in
# $OUT/timing/summary.md; every run in $OUT/timing/runs.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/timing
mkdir -p "$R"
. tools/gpu/build.sh
ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-30} MODELS=${MODELS:-"resnet50 gpt2"}
: > "$R/runs.jsonl"
for round in $(seq "$ROUNDS"); do
  for m in $MODELS; do
    for run in "pytorch " "stash policy:pytorch" "pytorch expandable_segments:True" \
               "stash policy:pytorch,expandable_segments:True" "stash policy:stash"; do
      set -- $run
      timeout 200 python3 tools/gpu/train_compare.py --model $m --alloc $1 --conf "${2:-}" --steps "$STEPS" \
        >> "$R/runs.jsonl" 2>> "$R/err.txt" || echo "$m $run failed" | tee -a "$R/err.txt"
    done
  done
done
: > "$R/alloc_bench.jsonl"
for run in "pytorch " "stash policy:pytorch" "stash policy:stash"; do
  set -- $run
  timeout 120 python3 bench/torch_alloc_bench.py --alloc $1 --conf "${2:-}" >> "$R/alloc_bench.jsonl" 2>> "$R/err.txt"
done
python3 - "$R/runs.jsonl" "$R/alloc_bench.jsonl" <<'PY' | tee "$R/summary.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med, gpu = {}, {}
for r in rows:
    key = (r["model"], r["alloc"], r["conf"])
    med.setdefault(key, []).append(r["median_step_ms"])
    gpu.setdefault(key, []).append(r.get("median_gpu_ms", 0))
def spread(v):
    return max(v) / min(v) - 1
print("| model | setting | stash step ms: median (runs) | PyTorch step ms: median (runs) | ratio | spread stash / PyTorch | GPU-time ratio |")
print("|---|---|---|---|---:|---|---:|")
for m in ("resnet50", "gpt2"):
    for conf, ref in (("policy:pytorch", ""), ("policy:pytorch,expandable_segments:True", "expandable_segments:True"),
                      ("policy:stash", "")):
        s, p = med.get((m, "stash", conf), []), med.get((m, "pytorch", ref), [])
        if s and p:
            gs, gp = gpu[(m, "stash", conf)], gpu[(m, "pytorch", ref)]
            print("| %s | %s | %.2f (%s) | %.2f (%s) | %.3f | %.1f%% / %.1f%% | %.3f |" % (
                m, conf, statistics.median(s), ", ".join("%.2f" % x for x in s),
                statistics.median(p), ", ".join("%.2f" % x for x in p),
                statistics.median(s) / statistics.median(p), 100 * spread(s), 100 * spread(p),
                statistics.median(gs) / statistics.median(gp)))
print()
print("One tensor's torch.empty + del, ns (median of 15 x 20000, cached):")
print()
for l in open(sys.argv[2]):
    if l.strip():
        r = json.loads(l)
        print("- %s %s: %s" % (r["alloc"], r["conf"], ", ".join("%s B %.0f" % kv for kv in r["ns_per_pair"].items())))
PY
