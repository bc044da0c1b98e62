#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for, or an H100 80GB - run on one in
# the thirty-sixth session, docs/results/gpu-h100-36.md): stash's memory under NVIDIA's compute-sanitizer (memcheck:
# every kernel's and every CUDA call's device memory access checked against the allocations
# the driver knows, virtual memory mappings included). Runs
#   - test-cuda (patterns written and read back through reuse, splits, stitched ranges,
#     record_stream, out of memory and empty_cache), policy:stash and policy:pytorch;
#   - a positive control (tools/gpu/sanitizer_control.py: a write to memory stash has
#     unmapped must be reported, one to memory it has mapped must not);
#   - a few training steps of GPT-2 small and ResNet-50 with stash as PyTorch's allocator
#     (policy:stash: stitched ranges, turn replay), and GPT-2 under PyTorch's own allocator
#     (its expandable segments cannot be: under the sanitizer their first cuMemCreate fails
#     with CUDA_ERROR_NOT_PERMITTED, 2026-12-01);
# each under `compute-sanitizer --tool memcheck`, and prints each run's ERROR SUMMARY.
# Logs go to $OUT/sanitizer/. STEPS: training steps per run (default 6: train_compare.py's
# step time is a median from the sixth on); RUN_TIMEOUT: seconds per run (default 240).
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$OUT/sanitizer
mkdir -p "$R"
STASH_GPU_TESTS=ON . tools/gpu/build.sh
CS="compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3"
steps=${STEPS:-6}
run() { # name, command...
  local name=$1
  shift
  local t0=$SECONDS
  timeout "${RUN_TIMEOUT:-240}" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  printf '%-34s exit %3d  %4ds  %s\n' "$name" "$rc" $((SECONDS - t0)) \
    "$(grep -E 'ERROR SUMMARY' "$R/$name.log" | tail -1)"
}
# test-cuda makes four failing calls on purpose (three allocations larger than the card, a
# bogus free): API errors not reported here, memory accesses only
run test-cuda $CS --report-api-errors no build-gpu/tests/test-cuda
run control-use-after-empty-cache $CS python3 tools/gpu/sanitizer_control.py
run gpt2-stash $CS python3 tools/gpu/train_compare.py --model gpt2 --alloc stash \
  --conf policy:stash --steps "$steps"
run gpt2-pytorch $CS python3 tools/gpu/train_compare.py --model gpt2 --alloc pytorch \
  --steps "$steps"
run resnet50-stash $CS python3 tools/gpu/train_compare.py --model resnet50 --alloc stash \
  --conf policy:stash --steps "$steps" --batch 64
c=$R/control-use-after-empty-cache.log
echo "control: invalid accesses reported before the marker (mapped memory):" \
  "$(sed '/MARKER/q' "$c" | grep -c 'Invalid __global__'), after it (released memory):" \
  "$(sed '1,/MARKER/d' "$c" | grep -c 'Invalid __global__')"
grep -E "first write|reserved after|MARKER" "$c"
# the training runs' own result lines (losses, peak reserved), for the record
for f in gpt2-stash gpt2-pytorch resnet50-stash; do
  printf '%s: %s\n' "$f" "$(grep -E '^\{' "$R/$f.log" | tail -1 | cut -c1-300)"
done
