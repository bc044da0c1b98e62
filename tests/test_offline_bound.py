#!/usr/bin/env python3
"""tools/offline_bound.py on a trace made so that the three orders differ, with the
answers worked out by hand:

  t0 alloc A 4 MiB, t1 alloc B 2 MiB, t2 free A, t3 alloc C 6 MiB, t4 free B, t5 free C

Peak live 8 MiB (B + C). In allocation order (best fit, each block where it fits then), C
finds only A's 4 MiB hole below B and goes above it: 12 MiB. Largest first, C goes at 0, A
at 0 (they never live together) and B above both: 8 MiB. Longest-lived first, B at 0, then
C and A above it: 8 MiB. Also: a gzipped copy reads the same, and no argument prints usage.

  test_offline_bound.py TOOL
"""
import gzip
import os
import subprocess
import sys
import tempfile

MiB = 1 << 20
ROWS = [("allocate", "0xa000", 4), ("allocate", "0xb000", 2), ("free", "0xa000", 4),
        ("allocate", "0xc000", 6), ("free", "0xb000", 2), ("free", "0xc000", 6)]


def main():
    tool = sys.argv[1]
    text = "Thread,Time,Action,Pointer,Size,Stream\n" + "".join(
        "0,00:00:0%d.000000,%s,%s,%d,0x0\n" % (i, a, p, s * MiB) for i, (a, p, s) in enumerate(ROWS))
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        plain, packed = os.path.join(tmp, "t.csv"), os.path.join(tmp, "t.csv.gz")
        open(plain, "w").write(text)
        with gzip.open(packed, "wt") as f:
            f.write(text)
        out = subprocess.run([sys.executable, tool, plain, packed], capture_output=True,
                             text=True, check=True).stdout.splitlines()
        want = "%d %d %d (100.00%%) %d (100.00%%) %d (66.67%%)" % (
            3, 8 * MiB, 8 * MiB, 8 * MiB, 12 * MiB)
        for line in out[1:]:
            got = " ".join(line.split()[1:])
            ok = got == want
            bad += not ok
            print("%s: %s%s" % (line.split()[0], got, "" if ok else "  (want %s)" % want))
        if len(out) != 3:
            print("expected a header and two rows, got %d lines" % len(out))
            bad += 1
        usage = subprocess.run([sys.executable, tool], capture_output=True, text=True)
        if usage.returncode != 2 or "offline" not in usage.stdout:
            print("no usage without arguments")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
