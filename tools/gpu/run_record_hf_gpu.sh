#!/usr/bin/env bash
# On the device machine (one GPU: an H200, or an H100 when the device tool gives one):
# record traces with the shared traces' own loop (tools/gpu/record_hf.py: forward, backward,
# step, zero_grad) on more models, and replay each once through cudaMallocAsync for its
# anchor, with the shared tools' anchor_replay.cpp (carry a copy:
# ANCHOR_REPLAY=path/to/anchor_replay.cpp). WORKLOADS picks some (default: all);
# DEADLINE=seconds starts no workload after that many. RECORDER=tools/gpu/record_loops.py
# records its loop variants instead (data/traces/loops).
# Everything comes back in $OUT/traces-hf.tar:  tar -xf traces-hf.tar
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/traces-hf
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/machine.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" >> "$R/machine.txt"
C=$(dirname "$(dirname "$(which nvcc)")")
g++ -O2 -std=c++17 "${ANCHOR_REPLAY:-build-shared/anchor_replay.cpp}" -o /tmp/anchor_replay \
  -I"$C/include" -L"$C/lib64" -lcudart -Wl,-rpath,"$C/lib64" 2>> "$R/err.txt" || echo "anchor_replay: build failed" >> "$R/err.txt"
REC=${RECORDER:-tools/gpu/record_hf.py}
W=${WORKLOADS:-$(python3 "$REC" 2>&1 | sed -n 's/^workloads: //p')}
start=$(date +%s)
for w in $W; do
  t0=$(date +%s)
  # DEADLINE (seconds): start no workload after it, so that the tar below still happens
  if [ -n "${DEADLINE:-}" ] && [ $(( t0 - start )) -gt "$DEADLINE" ]; then echo "$w skipped: past DEADLINE" >> "$R/err.txt"; continue; fi
  timeout 200 python3 "$REC" "$w" "$R" >> "$R/runs.jsonl" 2>> "$R/err.txt" || { echo "$w failed" >> "$R/err.txt"; continue; }
  zcat "$R/$w.csv.gz" > /tmp/$w.csv
  PASSES=1 timeout 120 /tmp/anchor_replay async /tmp/$w.csv | sed "s/^{/{\"workload\":\"$w\",/" >> "$R/async.jsonl" 2>> "$R/err.txt"
  rm -f /tmp/$w.csv
  echo "$w $(( $(date +%s) - t0 )) s" >> "$R/times.txt"
done
cat "$R/times.txt" "$R/err.txt" | tail -40
tar -C "$R" -cf "$OUT/traces-hf.tar" . && rm -rf "$R"  # one file comes back
