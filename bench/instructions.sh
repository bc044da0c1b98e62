#!/usr/bin/env bash
# Instructions and L1 data-cache misses per event of a steady pass, counted by valgrind's
# cachegrind (Debian: apt-get install valgrind): the same figures on every run and machine,
# where a time measured on a shared VM moves by 20-40% from run to run.
#
#   bench/instructions.sh [--conf STR]... [BENCH_REPLAY...] -- TRACE...
#
# Each BENCH_REPLAY (default: build/bench_replay) replays each TRACE under each --conf (default
# policy:stash and policy:pytorch) twice under cachegrind, with 1 and with 9 steady passes
# (--passes; every run also makes its cold and warm pass and reads the trace): the difference
# over 8 is one steady pass, divided by the trace's events. Several BENCH_REPLAYs: builds of
# two commits side by side (bench_replay of each), on the same traces.
set -euo pipefail
cd "$(dirname "$0")/.."
confs=() exes=() traces=()
while [ $# -gt 0 ]; do
  case "$1" in
    --conf) confs+=("$2"); shift 2 ;;
    --) shift; traces=("$@"); break ;;
    *) exes+=("$1"); shift ;;
  esac
done
[ ${#confs[@]} -gt 0 ] || confs=(policy:stash policy:pytorch)
[ ${#exes[@]} -gt 0 ] || exes=(build/bench_replay)
[ ${#traces[@]} -gt 0 ] || {
  echo "usage: $0 [--conf STR]... [BENCH_REPLAY...] -- TRACE..." >&2
  exit 2
}
command -v valgrind >/dev/null || { echo "$0: valgrind not found (apt-get install valgrind)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# counts EXE CONF TRACE PASSES: "instructions d1-misses" of the whole run
counts() {
  valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null "$1" --reps 1 \
    --passes "$4" --no-pairs --conf "$2" "$3" 2>&1 >/dev/null |
    sed 's/==[0-9]*== *//' |
    awk '/^I +refs/ {gsub(",", "", $3); i = $3} /^D1 +misses/ {gsub(",", "", $3); d = $3}
         END {if (i == "" || d == "") exit 1; print i, d}'
}

# A trace's number of events: stash-replay's (STASH_REPLAY, default build/stash-replay).
replay=${STASH_REPLAY:-build/stash-replay}
printf '%-28s %-16s %-32s %10s %12s\n' trace configuration bench_replay "instr/ev" "L1d miss/ev"
for t in "${traces[@]}"; do
  ev=$("$replay" --json --conf policy:pytorch "$t" | head -1 | python3 -c \
    'import json, sys; print(json.loads(sys.stdin.readline())["events"])')
  for c in "${confs[@]}"; do
    for e in "${exes[@]}"; do
      read -r i1 d1 < <(counts "$e" "$c" "$t" 1)
      read -r i9 d9 < <(counts "$e" "$c" "$t" 9)
      python3 -c "import sys; t, c, e = sys.argv[1:4]; i1, d1, i9, d9, ev = map(int, sys.argv[4:])
print('%-28s %-16s %-32s %10.0f %12.2f' % (t, c, e, (i9 - i1) / 8 / ev, (d9 - d1) / 8 / ev))" \
        "$(basename "$t")" "$c" "$e" "$i1" "$d1" "$i9" "$d9" "$ev"
    done
  done
done
