#!/usr/bin/env bash
# On a machine with 2 GPUs (kind nvidia-h200-x2): DDP through stash, one rank per GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/ddp
mkdir -p "$R"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTASH_BUILD_TESTS=OFF > "$R/build.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >> "$R/build.log" 2>&1 || { tail -30 "$R/build.log"; exit 1; }
export STASH_LIBRARY=$PWD/build-gpu/libstash.so STASH_PROVIDER=cuda
nvidia-smi --query-gpu=index,name --format=csv > "$R/gpus.txt"
for conf in policy:stash policy:pytorch; do
  name=${conf#policy:}
  timeout 240 torchrun --standalone --nproc_per_node=2 tools/gpu/ddp_check.py "$conf" \
    > "$R/ddp_$name.json" 2> "$R/ddp_$name.err"
  echo "ddp $conf: exit $?"
  cat "$R/ddp_$name.json"
  grep -v "^\s*$" "$R/ddp_$name.err" | tail -15
done
