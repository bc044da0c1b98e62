#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for, or an H100 80GB - run on one in
# the thirty-fifth session, docs/results/gpu-check-35-tail.md): policy:stash at the device's
# limit, on the GPU itself.
# Each trace is replayed through the CUDA provider under a memory fraction that leaves the
# heap a given number of MiB, and on the simulated device with the same total memory and
# fraction. Expected: the same out-of-memory count and peak reserved bytes on both, no
# out-of-memory error under policy:stash (which turns tight there) or max_piece_size_mb:20,
# and the driver's memory in use equal to reserved at every reading (--driver-check).
#
#   LIMITS="TRACE:MIB ..."  traces (data/traces/TRACE.csv.gz) and the heap's MiB. Default: the
#                           three shared traces at the device expandable segments need at the
#                           limit on the simulated H200 (tools/min_capacity.py;
#                           tests/test_device_limit.py pins the figures)
#   CONFS="CONF ..."        default: policy:stash, with max_piece_size_mb:20, and with
#                           max_piece_size_mb:192 (its own largest pieces, never tight: it
#                           runs out at these limits)
#   NAME=DIR                results in $OUT/DIR/ (default limit)
# tools/gpu/run_limit_late_gpu.sh runs it on the twenty-third session's five traces.
set -uo pipefail
cd "$(dirname "$0")/../.."
LIMITS=${LIMITS:-"gpt2_train:13070 bert_varlen_train:12196 gpt2_sidestream_train:13072"}
CONFS=${CONFS:-"policy:stash policy:stash,max_piece_size_mb:20 policy:stash,max_piece_size_mb:192"}
R=$OUT/${NAME:-limit}
mkdir -p "$R"
[ -x build-gpu/stash-replay ] || STASH_GPU_TESTS=ON . tools/gpu/build.sh
TOTAL=$(python3 -c "import torch; print(torch.cuda.mem_get_info()[1])")
echo "device total (cuMemGetInfo): $TOTAL bytes" | tee "$R/summary.md"
: > "$R/replays.jsonl"
for tl in $LIMITS; do
  t=${tl%%:*}
  limit=${tl##*:}
  f=$(python3 -c "print(repr($limit * 2**20 / $TOTAL))")
  for c in $CONFS; do
    build-gpu/stash-replay --json --provider cuda --driver-check \
      --conf "$c,per_process_memory_fraction:$f" "data/traces/$t.csv.gz" >> "$R/replays.jsonl"
    build-gpu/stash-replay --json --provider sim --capacity "$TOTAL" \
      --conf "$c,per_process_memory_fraction:$f" "data/traces/$t.csv.gz" >> "$R/replays.jsonl"
  done
done
python3 - "$R/replays.jsonl" <<'PY' | tee -a "$R/summary.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| trace | conf | provider | out-of-memory errors | peak reserved | driver in use at peak | max gap | checks | modelled driver us |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %s | %s | %s | %d | %d | %s | %s | %s | %.0f |" % (
        r["trace"], r["conf"].split(",per_process")[0], r["provider"], r["ooms"],
        r["peak_reserved_bytes"], r.get("driver_used_at_peak_bytes", "-"),
        r.get("driver_gap_max_bytes", "-"), r.get("driver_checks", "-"),
        r.get("modeled_driver_us") or 0))
pairs = {}
for r in rows:
    pairs.setdefault((r["trace"], r["conf"].split(",per_process")[0]), {})[r["provider"]] = r
same = all(p["cuda"]["ooms"] == p["sim"]["ooms"] and
           p["cuda"]["peak_reserved_bytes"] == p["sim"]["peak_reserved_bytes"]
           for p in pairs.values() if "cuda" in p and "sim" in p)
fits = all(r["ooms"] == 0 for (t, c), p in pairs.items()
           if c in ("policy:stash", "policy:stash,max_piece_size_mb:20") for r in p.values())
gap0 = all(r.get("driver_gap_max_bytes", 0) == 0 for r in rows if r["provider"] == "cuda")
print("\nCUDA = simulated (out-of-memory errors and peak reserved) on every pair: %s" % same)
print("no out-of-memory error under policy:stash and max_piece_size_mb:20: %s" % fits)
print("driver in use = reserved at every reading: %s" % gap0)
PY
