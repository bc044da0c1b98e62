#!/usr/bin/env python3
"""tools/offline_bound.py on two traces made so that its placements differ, with the answers
worked out by hand (sizes in MiB; event i at t_i):

order.csv: t0 alloc A 4, t1 alloc B 2, t2 free A, t3 alloc C 6, t4 free B, t5 free C.
  Peak live 8 (B + C). In allocation order ("time": each block into the smallest hole
  between the blocks live then), C finds only A's hole of 4 below B and goes above it: 12.
  Largest first, C goes at 0, A at 0 (they never live together) and B above both: 8.
  Longest-lived first, B at 0, then C and A above it: 8. Plain best fit, like time: 12.

top.csv: t0 alloc X 3, t1 alloc Y 4, t2 alloc Z 2, t3 free X, t4 free Z, t5 alloc W 2,
  t6 alloc V 4 (Y, W, V never freed). Peak live 10 (Y + W + V).
  Time: X at 0, Y at 3, Z at 7; W goes into X's hole (0-2, the free space above Y, 7-9,
  only if no hole fits); V fits no hole (2-3 is left) and extends the free space above Y:
  7-11, extent 11. Plain best fit: W takes the smallest free block, the 2 above Y (7-9);
  V fits nowhere and goes above W: 9-13, extent 13. Size order (Y, V, X, W, Z): Y 0-4,
  V 4-8, X 4-7, W 8-10, Z 7-9: 10. Life order (Y, X, W, V, Z): Y 0-4, X 4-7, W 4-6,
  V 6-10, Z 7-9: 10.

turns.csv (--min-period 3): a turn T = alloc A 4, alloc B 2, free A, alloc C 6, free B,
  free C; then T, alloc O 8 (never freed: an optimizer's state), T, T, T (events t0-t24).
  Peak live 16 (O + B + C). The sizes repeat with period 3 over the last 6 allocations (not
  the 9th from the end: O); the last period's allocation with the fewest large bytes live
  before it is A (8, against 12 for B and 10 for C), so turns start at each A, and the first
  turn is only seen: the time rule places it and O (A 0-4, B 4-6, C 6-12; O 0-8), then each
  later turn is planned largest first around O: C 8-14, A 8-12 (C is not yet live), B 14-16:
  16. Time, in every turn after the first: A 8-12, B 12-14, C finds only A's hole of 4 and
  goes above B: 14-20. Best fit the same: 20. Size: O 0-8, the first C 0-6 (before O), the
  others 8-14, the first A 0-4, the others 8-12, the first B 6-8, the others 14-16: 16.
  Life: O, then the B's (0-2, then 8-10 beside O), C's (2-8, 10-16), A's (2-6, 10-14): 16.
  The two traces above have no period: "-".

Also: a gzipped copy reads the same, no argument prints usage (exit 2), -h and --help print it
(exit 0), an unknown option is refused by name, and a file that is no trace or is missing
gets one line naming it (exit 1).

  test_offline_bound.py TOOL
"""
import gzip
import os
import subprocess
import sys
import tempfile

MiB = 1 << 20
TRACES = {
    "order.csv": ([("allocate", "0xa000", 4), ("allocate", "0xb000", 2), ("free", "0xa000", 4),
                   ("allocate", "0xc000", 6), ("free", "0xb000", 2), ("free", "0xc000", 6)],
                  # blocks, peak live, extents by size, life, time, best fit
                  (3, 8, [8, 8, 12, 12, None])),
    "top.csv": ([("allocate", "0x1000", 3), ("allocate", "0x2000", 4), ("allocate", "0x3000", 2),
                 ("free", "0x1000", 3), ("free", "0x3000", 2), ("allocate", "0x4000", 2),
                 ("allocate", "0x5000", 4)],
                (5, 10, [10, 10, 11, 13, None])),
    "turns.csv": ([("allocate", "0xa0", 4), ("allocate", "0xb0", 2), ("free", "0xa0", 4),
                   ("allocate", "0xc0", 6), ("free", "0xb0", 2), ("free", "0xc0", 6),
                   ("allocate", "0xf0", 8)] +
                  sum([[("allocate", "0xa%d" % i, 4), ("allocate", "0xb%d" % i, 2),
                        ("free", "0xa%d" % i, 4), ("allocate", "0xc%d" % i, 6),
                        ("free", "0xb%d" % i, 2), ("free", "0xc%d" % i, 6)] for i in (2, 3, 4)],
                      []),
                  (13, 16, [16, 16, 20, 20, 16])),
}


def expected(nblocks, live, extents):
    return "%d %d %s" % (nblocks, live * MiB, " ".join(
        "-" if e is None else "%d (%.2f%%)" % (e * MiB, 100.0 * live / e) for e in extents))


def main():
    tool = sys.argv[1]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        paths, want = [], {}
        for name, (rows, answer) in TRACES.items():
            text = "Thread,Time,Action,Pointer,Size,Stream\n" + "".join(
                "0,00:00:0%d.000000,%s,%s,%d,0x0\n" % (i, a, p, s * MiB)
                for i, (a, p, s) in enumerate(rows))
            plain = os.path.join(tmp, name)
            open(plain, "w").write(text)
            with gzip.open(plain + ".gz", "wt") as f:
                f.write(text)
            paths += [plain, plain + ".gz"]
            want[name] = want[name + ".gz"] = expected(*answer)
        out = subprocess.run([sys.executable, tool, "--min-period", "3"] + paths,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        for line in out[1:]:
            name = line.split()[0]
            got = " ".join(line.split()[1:])
            ok = got == want.get(name)
            bad += not ok
            print("%s: %s%s" % (name, got, "" if ok else "  (want %s)" % want.get(name)))
        if len(out) != 1 + len(paths):
            print("expected a header and %d rows, got %d lines" % (len(paths), len(out)))
            bad += 1
        usage = subprocess.run([sys.executable, tool], capture_output=True, text=True)
        if usage.returncode != 2 or "offline" not in usage.stdout:
            print("no usage without arguments")
            bad += 1
        for flag in ("-h", "--help"):
            helped = subprocess.run([sys.executable, tool, flag], capture_output=True, text=True)
            if helped.returncode != 0 or "offline" not in helped.stdout:
                print("%s: no usage, or not exit 0" % flag)
                bad += 1
        wrong = subprocess.run([sys.executable, tool, "--min-perid", "3", paths[0]],
                               capture_output=True, text=True)
        if wrong.returncode != 2 or "unknown option --min-perid" not in wrong.stderr:
            print("a misspelt option was not refused by name: %r" % wrong.stderr)
            bad += 1
        garbage = os.path.join(tmp, "garbage.csv")
        with open(garbage, "w") as f:
            f.write("not,a,trace\n1,2,3\n")
        for path, why in ((garbage, "no column Action"),
                          (os.path.join(tmp, "missing.csv"), "No such file")):
            r = subprocess.run([sys.executable, tool, path], capture_output=True, text=True)
            if r.returncode != 1 or "cannot read the trace" not in r.stderr or why not in r.stderr \
                    or "Traceback" in r.stderr:
                print("%s: want one line naming it (%s), got %r" % (path, why, r.stderr))
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
