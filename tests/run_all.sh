#!/usr/bin/env bash
# Every test, three ways: a normal build, an AddressSanitizer + UndefinedBehaviorSanitizer
# build, and a ThreadSanitizer build of the threaded tests. Run from anywhere:
#   tests/run_all.sh            (build dirs: build, build-asan, build-tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

step() { printf '\n=== %s ===\n' "$*"; }

step "normal build (RelWithDebInfo): every test"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

step "AddressSanitizer + UndefinedBehaviorSanitizer: every test"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSTASH_SANITIZE="address;undefined" \
  -DSTASH_LATER_CHECK_EVERY=200 >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

step "ThreadSanitizer: the threaded tests"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTASH_SANITIZE=thread >/dev/null
cmake --build build-tsan -j"$jobs" --target test-threads test-default
TSAN_OPTIONS=halt_on_error=1 STASH_STRESS_ITERS=5000 \
  ctest --test-dir build-tsan --output-on-failure -R '^(threads|default)$'

printf '\nall tests passed (normal, asan+ubsan, tsan)\n'
