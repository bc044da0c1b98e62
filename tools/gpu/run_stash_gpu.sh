#!/usr/bin/env bash
# On the device machine (one GPU: an H200, or an H100 when the device tool gives one): the
# GPU check of policy:stash. Builds stash, runs the GPU tests (test-cuda: patterns through
# stitched ranges, record_stream, out of memory, empty_cache measured by the driver), then
# replays the four traces under policy:stash (and policy:pytorch, for comparison) on the GPU
# with --driver-check and on the simulated device, times cuStreamWaitEvent (wait_probe.c) and
# the fast path there. Results go
# to $OUT/stash/ (and $OUT/stash.tar).
# TRACES="a.csv.gz b.pickle.gz ..." replays those instead of the four shared traces (TRACES=all:
# every recorded trace, the 413 that compare_policies.py scores);
# CONFS="policy:stash" replays only those configurations (default: policy:stash and
# policy:pytorch); BENCH=0 skips the timing.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/stash
mkdir -p "$R"
STASH_GPU_TESTS=ON . tools/gpu/build.sh
build-gpu/tests/test-cuda > "$R/test-cuda.log" 2>&1
echo "test-cuda: exit $?"
cat "$R/test-cuda.log" | head -40
# the host time of cuStreamWaitEvent (policy:stash's stream_wait), beside cuEventRecord's
cc -O2 -I/usr/local/cuda/include tools/gpu/wait_probe.c -L/usr/local/cuda/lib64/stubs -lcuda \
  -o build-gpu/wait_probe && build-gpu/wait_probe | tee "$R/wait_probe.txt"
: > "$R/replays.jsonl"
[ "${TRACES:-}" = all ] &&
  TRACES="$(ls data/traces/*.csv.gz data/traces/more*/*.pickle.gz data/traces/*/*.csv.gz | sort -u)"
for t in ${TRACES:-data/traces/resnet50_train.csv.gz data/traces/gpt2_train.csv.gz
                  data/traces/bert_varlen_train.csv.gz data/traces/gpt2_sidestream_train.csv.gz}; do
  for c in ${CONFS:-policy:stash policy:pytorch}; do
    build-gpu/stash-replay --json --provider cuda --driver-check --conf "$c" "$t" >> "$R/replays.jsonl"
    build-gpu/stash-replay --json --provider sim --conf "$c" "$t" >> "$R/replays.jsonl"
  done
done
[ "${BENCH:-1}" = 0 ] || build-gpu/bench_replay --reps 7 --conf policy:stash --conf policy:pytorch \
  --conf policy:pytorch,expandable_segments:True data/traces/*.csv.gz > "$R/bench.txt" 2>&1
python3 - "$R/replays.jsonl" <<'PY' | tee "$R/summary.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| trace | conf | provider | peak reserved | util | driver in use at peak | max gap | checks | ns/event |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %s | %s | %s | %d | %.2f%% | %s | %s | %s | %.0f |" % (
        r["trace"], r["conf"], r["provider"], r["peak_reserved_bytes"], 100 * r["utilization"],
        r.get("driver_used_at_peak_bytes", "-"), r.get("driver_gap_max_bytes", "-"),
        r.get("driver_checks", "-"), r["ns_per_event"]))
PY
[ "${BENCH:-1}" = 0 ] || cat "$R/bench.txt"
tar -C "$OUT" -cf "$OUT/stash.tar" stash
