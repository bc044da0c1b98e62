#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for; not yet run on the H100 80GB the
# device tool sometimes gives): GPT-2 small (the shared traces' model, batch 8 x 1024)
# trained for 8 steps on a GPU made smaller with torch.cuda.set_per_process_memory_fraction:
# the allocator's reserved memory capped at 0.5-8% above (CAPS: other percentages) the run's peak live bytes (its
# max_memory_allocated without a cap). Under each cap: policy:stash, policy:stash with
# max_piece_size_mb:20, and PyTorch's allocator with expandable segments (and its default).
# A run that cannot allocate stops (PyTorch's OutOfMemoryError; stash's plug-in stops the
# process with the reason): "fits" is a run that finishes its 8 steps. $OUT/limit_train/.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/limit_train
mkdir -p "$R"
[ -f build-gpu/libstash.so ] || . tools/gpu/build.sh
export STASH_LIBRARY=$PWD/build-gpu/libstash.so
TOTAL=$(python3 -c "import torch; print(torch.cuda.mem_get_info()[1])")
train() { timeout 180 python3 tools/gpu/train_compare.py --model gpt2 --steps 8 "$@"; }
train --alloc stash --conf policy:stash > "$R/free.json" 2> "$R/free.err"
LIVE=$(python3 -c "import json; print(json.load(open('$R/free.json'))['max_allocated'])")
echo "device total $TOTAL bytes; peak live (policy:stash, no cap) $LIVE bytes" | tee "$R/summary.md"
: > "$R/runs.jsonl"
for pct in ${CAPS:-0.5 1 1.5 2 3 4 5 6 8}; do
  f=$(python3 -c "print(repr($LIVE * (1 + $pct / 100) / $TOTAL))")
  for run in "stash policy:stash" "stash policy:stash,max_piece_size_mb:20" \
             "pytorch expandable_segments:True" "pytorch "; do
    set -- $run
    out=$(train --alloc "$1" --conf "${2:-}" --fraction "$f" 2> "$R/last.err")
    rc=$?
    python3 - "$pct" "$1" "${2:-}" "$rc" "$out" "$R/last.err" >> "$R/runs.jsonl" <<'PY'
import json, sys
pct, alloc, conf, rc, out, err = sys.argv[1:7]
d = json.loads(out) if rc == "0" and out.strip() else {}
tail = open(err).read().strip().splitlines()[-1:] if rc != "0" else []
print(json.dumps({"cap_over_live_pct": float(pct), "alloc": alloc, "conf": conf, "fits": rc == "0",
                  "max_reserved": d.get("max_reserved"), "max_allocated": d.get("max_allocated"),
                  "losses": d.get("losses"), "error": tail[0][:300] if tail else None}))
PY
  done
done
python3 - "$R/runs.jsonl" <<'PY' | tee -a "$R/summary.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
confs = []
for r in rows:
    k = (r["alloc"], r["conf"])
    if k not in confs:
        confs.append(k)
caps = sorted({r["cap_over_live_pct"] for r in rows})
print("| cap over peak live | " + " | ".join("%s %s" % k for k in confs) + " |")
print("|---|" + "---|" * len(confs))
for c in caps:
    cells = []
    for k in confs:
        r = next(x for x in rows if x["cap_over_live_pct"] == c and (x["alloc"], x["conf"]) == k)
        cells.append("fits (%d)" % r["max_reserved"] if r["fits"] else "out of memory")
    print("| +%g%% | %s |" % (c, " | ".join(cells)))
PY
