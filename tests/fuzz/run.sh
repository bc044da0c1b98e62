#!/usr/bin/env bash
# Fuzz the trace readers with libFuzzer (clang from Debian's packages), with AddressSanitizer
# and UndefinedBehaviorSanitizer, starting from tests/fuzz/corpus; new interesting inputs are
# added to the corpus (commit the small ones). Usage: tests/fuzz/run.sh [SECONDS] (default 120).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-120}
out=build-fuzz
mkdir -p "$out"
flags="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -Iinclude -Isrc -Itools"
srcs=$(ls src/*.c | grep -v provider_cuda.c) # the CUDA provider is not needed: simulated device
tools=$(ls tools/*.c | grep -v stash_replay.c)  # the replay engine: every tool file but the CLI's main
clang $flags -std=c11 -o "$out/fuzz_trace" tests/fuzz/fuzz_trace.c $tools $srcs -lz -lpthread -lm
mkdir -p "$out/new"
"$out/fuzz_trace" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=4096 -timeout=20 \
  "$out/new" tests/fuzz/corpus
echo "new inputs in $out/new; 'fuzz_trace -merge=1 tests/fuzz/corpus $out/new' keeps the useful ones"
