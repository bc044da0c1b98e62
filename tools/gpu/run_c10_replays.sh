#!/usr/bin/env bash
# On the device machine: build c10_replay against the image's PyTorch and replay every
# shared trace under PyTorch's four settings, writing the replayed logs (with the addresses
# this run's driver returned) and PyTorch's figures under $OUT.
set -euo pipefail
cd "$(dirname "$0")"
D=$(pwd)
T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
C=$(dirname "$(dirname "$(which nvcc)")")
g++ -O2 -std=c++17 c10_replay.cpp -o /tmp/c10_replay -I"$T/include" -I"$C/include" \
  -L"$T/lib" -lc10_cuda -lc10 -L"$C/lib64" -lcudart -Wl,-rpath,"$T/lib" -Wl,-rpath,"$C/lib64"
mkdir -p "$OUT/c10"
for t in resnet50_train gpt2_train bert_varlen_train gpt2_sidestream_train; do
  zcat "../../data/traces/$t.csv.gz" > "/tmp/$t.csv"
  for s in "" expandable_segments:True max_split_size_mb:200 roundup_power2_divisions:4; do
    tag=${s%%:*}; tag=${tag:-default}
    if [ -n "$s" ]; then export PYTORCH_CUDA_ALLOC_CONF="$s"; else unset PYTORCH_CUDA_ALLOC_CONF; fi
    /tmp/c10_replay "/tmp/$t.csv" "/tmp/$t.$tag.csv" >> "$OUT/c10/figures.jsonl"
  done
done
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp && tar czf "$OUT/c10/replayed_logs.tgz" ./*.*.csv)
cat "$OUT/c10/figures.jsonl"
# The driver's own placement of plain allocations, for the simulated device's model.
cd "$D"
gcc -O2 va_probe.c -I"$C/include" -L"$C/lib64/stubs" -lcuda -o /tmp/va_probe
mkdir -p /tmp/probe
for p in probe_*.txt; do /tmp/va_probe < "$p" > "/tmp/probe/${p%.txt}.out"; done
(cd /tmp && tar czf "$OUT/c10/probes.tgz" probe)
