#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for; not yet run on the H100 80GB the
# device tool sometimes gives): build stash, run every test (the GPU ones included),
# replay the four traces under PyTorch's four settings on the GPU (--provider cuda, one
# process per replay) and on the simulated device, time PyTorch's own allocator on the
# same traces and machine, and run bench_replay there. Results go to $OUT/gpu/.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/gpu
mkdir -p "$R"
STASH_GPU_TESTS=ON . tools/gpu/build.sh
env -u STASH_LIBRARY -u STASH_PROVIDER ctest --test-dir build-gpu --output-on-failure -j4 \
  > "$R/ctest.log" 2>&1  # each test sets the provider it needs
echo "ctest: $(grep -E 'tests passed|tests failed' "$R/ctest.log")"
grep -E "^  policy|^  .*reserved|skipped|Skipped|Failed|CHECK" "$R/ctest.log" | head -40
# GPU and simulated replays, one process each.
: > "$R/replays.jsonl"
for t in resnet50_train gpt2_train bert_varlen_train gpt2_sidestream_train; do
  for s in "" ",expandable_segments:True" ",max_split_size_mb:200" ",roundup_power2_divisions:4"; do
    for p in cuda sim; do
      build-gpu/stash-replay --json --provider $p --conf "policy:pytorch$s" "data/traces/$t.csv.gz" >> "$R/replays.jsonl"
    done
  done
done
# PyTorch's own allocator on the same traces (one pass, fresh process, timed, no log).
T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
C=$(dirname "$(dirname "$(which nvcc)")")
g++ -O2 -std=c++17 tools/gpu/c10_replay.cpp -o /tmp/c10_replay -I"$T/include" -I"$C/include" \
  -L"$T/lib" -lc10_cuda -lc10 -L"$C/lib64" -lcudart -Wl,-rpath,"$T/lib" -Wl,-rpath,"$C/lib64"
: > "$R/pytorch.jsonl"
for t in resnet50_train gpt2_train bert_varlen_train gpt2_sidestream_train; do
  zcat "data/traces/$t.csv.gz" > "/tmp/$t.csv"
  for s in "" expandable_segments:True max_split_size_mb:200 roundup_power2_divisions:4; do
    if [ -n "$s" ]; then export PYTORCH_CUDA_ALLOC_CONF="$s"; else unset PYTORCH_CUDA_ALLOC_CONF; fi
    /tmp/c10_replay "/tmp/$t.csv" - >> "$R/pytorch.jsonl"
  done
done
unset PYTORCH_CUDA_ALLOC_CONF
build-gpu/bench_replay --reps 7 data/traces/*.csv.gz > "$R/bench.txt" 2>&1
python3 tools/gpu/summarize.py "$R" | tee "$R/summary.md"
