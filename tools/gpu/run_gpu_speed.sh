#!/usr/bin/env bash
# On the device machine: the GPU tests, then stash's and PyTorch's allocators timed side by
# side on the same host CPU: replays of the shared traces (cold and warm pass) and the same
# size allocated and freed 10^6 times. Results in $OUT/speed/.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/speed
mkdir -p "$R"
STASH_GPU_TESTS=ON . tools/gpu/build.sh
build-gpu/tests/test-cuda 2>&1 | tee "$R/test-cuda.log"; echo "test-cuda rc=${PIPESTATUS[0]}"
T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
C=$(dirname "$(dirname "$(which nvcc)")")
g++ -O2 -std=c++17 tools/gpu/c10_replay.cpp -o /tmp/c10_replay -I"$T/include" -I"$C/include" \
  -L"$T/lib" -lc10_cuda -lc10 -L"$C/lib64" -lcudart -Wl,-rpath,"$T/lib" -Wl,-rpath,"$C/lib64" || exit 1
: > "$R/pytorch.jsonl"
for t in resnet50_train gpt2_train bert_varlen_train gpt2_sidestream_train; do
  zcat "data/traces/$t.csv.gz" > "/tmp/$t.csv"
  for s in "" expandable_segments:True; do
    if [ -n "$s" ]; then export PYTORCH_CUDA_ALLOC_CONF="$s"; else unset PYTORCH_CUDA_ALLOC_CONF; fi
    for rep in 1 2 3; do /tmp/c10_replay "/tmp/$t.csv" - >> "$R/pytorch.jsonl"; done
  done
done
unset PYTORCH_CUDA_ALLOC_CONF
/tmp/c10_replay --pairs > "$R/pytorch_pairs.jsonl"
build-gpu/bench_replay --reps 7 data/traces/*.csv.gz > "$R/stash_bench.txt" 2>&1
cat "$R/pytorch_pairs.jsonl" "$R/stash_bench.txt"
python3 - "$R" <<'PY'
import json, sys, statistics, collections
R = sys.argv[1]
d = collections.defaultdict(lambda: ([], []))
for l in open(R + "/pytorch.jsonl"):
    j = json.loads(l)
    k = (j["trace"].split("/")[-1].replace(".csv", ""), j["conf"] or "(default)")
    d[k][0].append(j["ns_per_event"]); d[k][1].append(j["warm_ns_per_event"])
for k, (c, w) in sorted(d.items()):
    print("pytorch %-22s %-26s cold %.0f warm %.0f" % (k[0], k[1], statistics.median(c), statistics.median(w)))
PY
