#!/usr/bin/env bash
# Did a change meant only to be faster change a decision? Builds bench_replay from OLD_SRC (a
# directory holding an older commit's src, include, tools, bench and CMakeLists.txt; this
# tree's bench/bench_replay.c is built in a copy of it, so an old commit without --digest
# serves too) and from this tree, and compares their `bench_replay --digest` lines - a hash of
# every address returned over three passes on one heap, peak reserved and provider calls - for
# every trace under data/traces (or TRACE...), policy:stash and policy:pytorch. Prints the
# traces that differ; exits 1 if any does.
#
#   git archive OLD src include tools bench CMakeLists.txt | (mkdir -p old && tar -x -C old)
#   bench/same_decisions.sh old [TRACE...]
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: $0 OLD_SRC [TRACE...]}
shift
traces=("$@")
[ ${#traces[@]} -gt 0 ] ||
  mapfile -t traces < <(find data/traces -name '*.csv.gz' -o -name '*.pickle' -o -name '*.pickle.gz' | sort)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
jobs=$(nproc 2>/dev/null || echo 2)
cp -r "$old" "$tmp/old"
cp bench/bench_replay.c "$tmp/old/bench/bench_replay.c"
for x in old new; do
  src=$([ $x = old ] && echo "$tmp/old" || echo .)
  cmake -S "$src" -B "$tmp/build-$x" -DSTASH_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$tmp/build-$x" -j"$jobs" --target bench_replay >/dev/null
done
# digests X: every trace, split over the cores
digests() {
  printf '%s\0' "${traces[@]}" |
    xargs -0 -n 8 -P "$jobs" "$tmp/build-$1/bench_replay" --digest --conf policy:stash \
      --conf policy:pytorch | sort > "$tmp/$1.txt"
}
digests old
digests new
n=$(wc -l < "$tmp/new.txt")
if diff "$tmp/old.txt" "$tmp/new.txt" > "$tmp/diff.txt"; then
  echo "same decisions: $n digests (traces x configurations) identical"
else
  echo "decisions differ:"
  cat "$tmp/diff.txt"
  exit 1
fi
