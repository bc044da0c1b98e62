#!/usr/bin/env bash
# Fuzz stash with libFuzzer (clang from Debian's packages), with AddressSanitizer and
# UndefinedBehaviorSanitizer:
#   tests/fuzz/run.sh [trace|ops|conf] [SECONDS]     (default: trace, 120 s)
# trace: the trace readers and the replay (tests/fuzz/fuzz_trace.c, corpus tests/fuzz/corpus);
# ops: the heap's API, operation by operation (tests/fuzz/fuzz_ops.c, tests/fuzz/corpus-ops);
# conf: STASH_CONF strings (tests/fuzz/fuzz_conf.c, tests/fuzz/corpus-conf).
# New interesting inputs go to build-fuzz/new-TARGET, a failing one to build-fuzz/crash-*;
# commit the small ones to the corpus (CTest's fuzz_TARGET_corpus tests replay them).
# The build is CMake's (STASH_FUZZ=ON), so it links what the library and the replay link.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=trace
case "${1:-}" in trace|ops|conf) target=$1; shift ;; esac
secs=${1:-120}
corpus=tests/fuzz/corpus
[ "$target" != trace ] && corpus=tests/fuzz/corpus-$target
out=build-fuzz
CC=clang cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DSTASH_FUZZ=ON \
  -DSTASH_WITH_CUDA=OFF -DSTASH_SANITIZE="address;undefined" >/dev/null
cmake --build "$out" -j"$(nproc 2>/dev/null || echo 2)" --target "fuzz-$target"
mkdir -p "$out/new-$target"
UBSAN_OPTIONS=print_stacktrace=1 "$out/tests/fuzz-$target" -max_total_time="$secs" \
  -max_len=65536 -rss_limit_mb=4096 -timeout=20 -artifact_prefix="$out/" "$out/new-$target" "$corpus"
echo "new inputs in $out/new-$target; '$out/tests/fuzz-$target -merge=1 $corpus $out/new-$target' keeps the useful ones"
