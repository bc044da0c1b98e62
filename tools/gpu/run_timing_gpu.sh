#!/usr/bin/env bash
# On the device machine (one H200): step times of ResNet-50 and GPT-2 under PyTorch's
# allocator and stash, interleaved (A B A B ...) so that drifts of the machine fall on both,
# 2 rounds of 30 steps; medians of the per-run medians, in $OUT/timing/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/timing
mkdir -p "$R"
. tools/gpu/build.sh
: > "$R/runs.jsonl"
for round in 1 2; do
  for m in resnet50 gpt2; do
    for run in "pytorch " "stash policy:pytorch" "pytorch expandable_segments:True" \
               "stash policy:pytorch,expandable_segments:True" "stash policy:stash"; do
      set -- $run
      timeout 200 python3 tools/gpu/train_compare.py --model $m --alloc $1 --conf "${2:-}" --steps 30 \
        >> "$R/runs.jsonl" 2>> "$R/err.txt" || echo "$m $run failed" | tee -a "$R/err.txt"
    done
  done
done
python3 - "$R/runs.jsonl" <<'PY' | tee "$R/summary.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = {}
for r in rows:
    med.setdefault((r["model"], r["alloc"], r["conf"]), []).append(r["median_step_ms"])
print("| model | setting | stash ms (runs) | PyTorch ms (runs) | ratio of medians |")
print("|---|---|---|---|---:|")
for m in ("resnet50", "gpt2"):
    for conf, ref in (("policy:pytorch", ""), ("policy:pytorch,expandable_segments:True", "expandable_segments:True"),
                      ("policy:stash", "")):
        s, p = med.get((m, "stash", conf), []), med.get((m, "pytorch", ref), [])
        if s and p:
            print("| %s | %s | %.2f (%s) | %.2f (%s) | %.3f |" % (m, conf, statistics.median(s),
                  ", ".join("%.2f" % x for x in s), statistics.median(p), ", ".join("%.2f" % x for x in p),
                  statistics.median(s) / statistics.median(p)))
PY
