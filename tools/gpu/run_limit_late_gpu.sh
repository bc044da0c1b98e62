#!/usr/bin/env bash
# On the device machine (one H200): the twenty-third session's rule at the device's limit -
# a heap that first holds 90% of what it may hold after its first drop turns tight there.
# Five traces whose smallest device the rule lowered most (tools/min_capacity.py on the
# simulated H200, +2 MiB) are replayed through the CUDA provider under a memory fraction that
# leaves the heap that much, and on the simulated device with the same total and fraction.
# Expected: no out-of-memory error and the same peak reserved bytes on both, and the driver's
# memory in use equal to reserved at every reading (--driver-check). Results in $OUT/limit-late/.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/limit-late
mkdir -p "$R"
[ -x build-gpu/stash-replay ] || STASH_GPU_TESTS=OFF . tools/gpu/build.sh
TOTAL=$(python3 -c "import torch; print(torch.cuda.mem_get_info()[1])")
echo "device total (cuMemGetInfo): $TOTAL bytes" | tee "$R/summary.md"
: > "$R/replays.jsonl"
for tl in hf/bert_varlen_seed2:12680 unseen/vgg19_b32:3360 eleventh/llama_b13:14202 \
          ninth/vgg16_b48:3898 seventeenth/gpt2_large_b4:29210; do
  t=${tl%%:*}
  limit=${tl##*:}
  f=$(python3 -c "print(repr($limit * 2**20 / $TOTAL))")
  for p in cuda sim; do
    extra=""; [ $p = cuda ] && extra="--driver-check"; [ $p = sim ] && extra="--capacity $TOTAL"
    build-gpu/stash-replay --json --provider $p $extra \
      --conf "policy:stash,per_process_memory_fraction:$f" "data/traces/$t.csv.gz" >> "$R/replays.jsonl"
  done
done
python3 - "$R/replays.jsonl" <<'PY' | tee -a "$R/summary.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| trace | provider | out-of-memory errors | peak reserved | driver in use at peak | max gap | checks |")
print("|---|---|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %s | %s | %d | %d | %s | %s | %s |" % (
        r["trace"], r["provider"], r["ooms"], r["peak_reserved_bytes"],
        r.get("driver_used_at_peak_bytes", "-"), r.get("driver_gap_max_bytes", "-"),
        r.get("driver_checks", "-")))
pairs = {}
for r in rows:
    pairs.setdefault(r["trace"], {})[r["provider"]] = r
same = all(p["cuda"]["ooms"] == p["sim"]["ooms"] == 0 and
           p["cuda"]["peak_reserved_bytes"] == p["sim"]["peak_reserved_bytes"]
           for p in pairs.values() if "cuda" in p and "sim" in p)
print("\nno out-of-memory error, CUDA = simulated peak reserved, on every trace: %s" % same)
PY
