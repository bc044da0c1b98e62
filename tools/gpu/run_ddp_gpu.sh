#!/usr/bin/env bash
# On a machine with 2 GPUs (kind nvidia-h200-x2): DDP through stash, one rank per GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/ddp
mkdir -p "$R"
. tools/gpu/build.sh
nvidia-smi --query-gpu=index,name --format=csv > "$R/gpus.txt"
for conf in policy:stash policy:pytorch; do
  name=${conf#policy:}
  timeout 240 torchrun --standalone --nproc_per_node=2 tools/gpu/ddp_check.py "$conf" \
    > "$R/ddp_$name.json" 2> "$R/ddp_$name.err"
  echo "ddp $conf: exit $?"
  cat "$R/ddp_$name.json"
  grep -v "^\s*$" "$R/ddp_$name.err" | tail -15
done
