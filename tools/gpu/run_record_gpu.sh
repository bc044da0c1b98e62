#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for; not yet run on the H100 80GB the
# device tool sometimes gives): record new traces - ResNet-50 and GPT-2 at other batch
# sizes than the shared traces', 8 steps under PyTorch's own allocator - as PyTorch memory
# snapshots in $OUT/traces.tar, to test policy:stash on traces it was not tuned on:
#   tar -xf traces.tar && build/stash-replay *.pickle.gz
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/traces
mkdir -p "$R"
for run in "resnet50 64" "resnet50 192" "gpt2 4" "gpt2 12"; do
  set -- $run
  f="$R/${1}_b$2.snapshot.pickle"
  timeout 200 python3 tools/gpu/train_compare.py --model "$1" --alloc pytorch --batch "$2" --steps 8 \
    --record "$f" >> "$R/runs.jsonl" 2>> "$R/err.txt" && gzip -9 "$f" || echo "$run failed" | tee -a "$R/err.txt"
done
ls -l "$R"
tar -C "$R" -cf "$OUT/traces.tar" . && rm -rf "$R"  # one file comes back
