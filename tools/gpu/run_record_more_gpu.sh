#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for; not yet run on the H100 80GB the
# device tool sometimes gives): record traces of three more models, with fused attention
# (tools/gpu/train_compare.py: gpt2sdpa, vit, bert), 8 steps under PyTorch's own allocator, as
# PyTorch memory snapshots; and run each once more under cudaMallocAsync for its peak reserved
# (the anchor the replay cannot compute). Everything comes back in $OUT/traces-more.tar:
#   tar -xf traces-more.tar && build/stash-replay *.pickle.gz
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/traces-more
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/machine.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$R/machine.txt"
for run in "gpt2sdpa 16" "vit 128" "bert 32"; do
  set -- $run
  f="$R/${1}_b$2.snapshot.pickle"
  timeout 240 python3 tools/gpu/train_compare.py --model "$1" --alloc pytorch --batch "$2" --steps 8 \
    --record "$f" >> "$R/runs.jsonl" 2>> "$R/err.txt" && gzip -9 "$f" || echo "$run failed" | tee -a "$R/err.txt"
  timeout 240 python3 tools/gpu/train_compare.py --model "$1" --alloc pytorch --batch "$2" --steps 8 \
    --conf backend:cudaMallocAsync >> "$R/runs.jsonl" 2>> "$R/err.txt" || echo "$run async failed" | tee -a "$R/err.txt"
done
ls -l "$R"
tar -C "$R" -cf "$OUT/traces-more.tar" . && rm -rf "$R"  # one file comes back
