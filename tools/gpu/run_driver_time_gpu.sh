#!/usr/bin/env bash
# On the device machine: the driver time of a replay measured on the GPU (stash-replay
# --provider cuda: the heap's provider calls timed on their way to the driver,
# tools/timed_provider.c) beside what the simulated device models for the same replay, under
# policy:stash and policy:pytorch - is issue 4's driver-time target (modelled) what the GPU
# says? Also runs the GPU tests. Results in $OUT/driver/.
# TRACES="a.csv.gz ..." replays those (default below); REPS (3) GPU replays of each.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/driver
mkdir -p "$R"
STASH_GPU_TESTS=ON . tools/gpu/build.sh
(cd build-gpu && ctest -L gpu --output-on-failure) > "$R/ctest-gpu.log" 2>&1
echo "ctest -L gpu: exit $?"
grep -E "tests passed|Failed|Passed|Skipped" "$R/ctest-gpu.log" | tail -8
T=data/traces
: > "$R/runs.jsonl"
for t in ${TRACES:-$T/resnet50_train.csv.gz $T/gpt2_train.csv.gz $T/bert_varlen_train.csv.gz
                   $T/gpt2_sidestream_train.csv.gz $T/seventeenth/gpt2_b24.csv.gz
                   $T/fresh/gpt2_small6_b16.csv.gz $T/fourteenth/vgg13_b64.csv.gz
                   $T/final/vgg11_b64.csv.gz $T/hf/llama_b8.csv.gz $T/loops2/gpt2_b8_infer.csv.gz
                   $T/hf/resnet50_b64.csv.gz $T/more/gpt2_b4.snapshot.pickle.gz}; do
  for c in policy:stash policy:pytorch; do
    build-gpu/stash-replay --json --provider sim --conf "$c" "$t" >> "$R/runs.jsonl"
    for r in $(seq "${REPS:-3}"); do
      build-gpu/stash-replay --json --provider cuda --conf "$c" "$t" >> "$R/runs.jsonl"
    done
  done
done
build-gpu/stash-replay --provider cuda --calls "$R/calls-gpt2_b24-gpu.txt" --conf policy:stash \
  --conf policy:pytorch $T/seventeenth/gpt2_b24.csv.gz > /dev/null
python3 - "$R/runs.jsonl" <<'PY' | tee "$R/summary.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault((r["trace"], r["conf"]), []).append(r)
traces = list(dict.fromkeys(r["trace"] for r in rows))
print("| trace | stash modelled | pytorch modelled | ratio | stash measured (median) | pytorch measured (median) | ratio | stash's verdict modelled / measured |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for t in traces:
    m, g = {}, {}
    for c in ("policy:stash", "policy:pytorch"):
        rs = by.get((t, c), [])
        m[c] = [r["modeled_driver_us"] for r in rs if r["provider"] == "sim"][0]
        g[c] = statistics.median(r["measured_driver_us"] for r in rs if r["provider"] == "cuda")
    vm = "pass" if m["policy:stash"] <= m["policy:pytorch"] else "fail"
    vg = "pass" if g["policy:stash"] <= g["policy:pytorch"] else "fail"
    print("| %s | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f | %s / %s |" % (
        t, m["policy:stash"], m["policy:pytorch"], m["policy:stash"] / m["policy:pytorch"],
        g["policy:stash"], g["policy:pytorch"], g["policy:stash"] / g["policy:pytorch"], vm, vg))
print()
print("Per kind of call, all traces together: calls, modelled us per call, measured us per call (median run)")
print()
print("| conf | call | calls | modelled us/call | measured us/call |")
print("|---|---|---:|---:|---:|")
for c in ("policy:stash", "policy:pytorch"):
    agg = {}
    for t in traces:
        rs = by.get((t, c), [])
        sim = [r for r in rs if r["provider"] == "sim"][0]
        gpu = sorted((r for r in rs if r["provider"] == "cuda"), key=lambda r: r["measured_driver_us"])
        gpu = gpu[len(gpu) // 2]
        for k, (n, us) in sim["calls"].items():
            a = agg.setdefault(k, [0, 0.0, 0, 0.0])
            a[0] += n
            a[1] += us
        for k, (n, us) in gpu["measured_calls"].items():
            a = agg.setdefault(k, [0, 0.0, 0, 0.0])
            a[2] += n
            a[3] += us
    for k, (n, us, gn, gus) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print("| %s | %s | %d (GPU %d) | %.1f | %.1f |" % (c, k, n, gn, us / n if n else 0, gus / gn if gn else 0))
PY
head -3 "$R/calls-gpt2_b24-gpu.txt"
grep -A3 "^total" "$R/calls-gpt2_b24-gpu.txt"
