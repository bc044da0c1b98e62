#!/usr/bin/env bash
# Host time of two sources side by side: bench_replay built from OLD_SRC (a directory holding
# an older commit's src, include, tools, bench and CMakeLists.txt) and from this tree, both
# RelWithDebInfo, run alternately ROUNDS times (default 3) pinned to one core, on the four
# shared traces (or TRACE...), policy:stash and policy:pytorch; then the medians of the
# rounds' steady figures, each build's ratio, and the same-size pairs.
#
#   git archive OLD src include tools bench CMakeLists.txt | (mkdir -p old && tar -x -C old)
#   bench/ab.sh old [TRACE...]          # OUT=dir keeps each run's table there
#
# Times move by 20-40% from run to run on a shared VM (bench/instructions.sh counts instead);
# on a dedicated machine's core three rounds agree within a few percent.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: $0 OLD_SRC [TRACE...]}
shift
traces=("$@")
[ ${#traces[@]} -gt 0 ] || traces=(data/traces/{resnet50_train,gpt2_train,bert_varlen_train,gpt2_sidestream_train}.csv.gz)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
jobs=$(nproc 2>/dev/null || echo 2)
core=${CORE:-$((jobs - 1))}
for x in 0 1; do
  src=$([ $x = 0 ] && echo "$old" || echo .)
  cmake -S "$src" -B "$out/build$x" -DSTASH_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$out/build$x" -j"$jobs" --target bench_replay >/dev/null
done
for r in $(seq "${ROUNDS:-3}"); do
  for x in 0 1; do
    taskset -c "$core" "$out/build$x/bench_replay" --reps 5 --passes 8 --conf policy:stash \
      --conf policy:pytorch "${traces[@]}" > "$out/bench-$x-$r.txt"
  done
done
python3 - "$out" <<'PY'
import collections, glob, os, statistics, sys
steady, pairs = collections.defaultdict(list), collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*-*.txt"))):
    b = os.path.basename(f).split("-")[1]
    in_pairs = False
    for line in open(f):
        p = line.split()
        if line.startswith("same size"):
            in_pairs = True
        elif in_pairs and len(p) == 3:
            pairs[(p[0], p[1], b)].append(float(p[2]))
        elif not in_pairs and len(p) >= 5 and p[0] != "trace":
            steady[(p[0], p[1], b)].append(float(p[-1]))
med = lambda v: statistics.median(v) if v else float("nan")
print("%-30s %-16s %10s %10s %8s" % ("trace", "configuration", "old ns/ev", "new ns/ev", "new/old"))
for t in dict.fromkeys(k[0] for k in steady):
    for c in dict.fromkeys(k[1] for k in steady):
        o, n = med(steady[(t, c, "0")]), med(steady[(t, c, "1")])
        print("%-30s %-16s %10.0f %10.0f %8.2f" % (t, c, o, n, n / o))
    for b in "01":
        s, q = med(steady[(t, "policy:stash", b)]), med(steady[(t, "policy:pytorch", b)])
        print("%-30s %-16s %10s %10.2f" % ("", "stash/pytorch", ["old", "new"][int(b)], s / q))
print("\n%-16s %10s %10s %10s" % ("pair", "size", "old ns", "new ns"))
for c, s in dict.fromkeys((k[0], k[1]) for k in pairs):
    print("%-16s %10s %10.1f %10.1f" % (c, s, med(pairs[(c, s, "0")]), med(pairs[(c, s, "1")])))
PY
