#!/usr/bin/env python3
"""Lengthen a recorded training trace: repeat its last training step N more times.

  tools/lengthen_trace.py TRACE OUT.csv.gz N

TRACE is an RMM CSV log or a PyTorch memory snapshot (pickled, plain or gzip; read with the
standard library's pickle, no torch needed); OUT is an RMM CSV log. The step is found as the
shortest period P (between 1/12 and 1/3 of the trace's events) for which the last P events
repeat the P before them, event by event (allocate or free, and size). The repetitions keep
the trace's pairing: a free in the step of a block allocated one step earlier (gradients
freed after the next forward pass, in some loops) frees the previous repetition's
counterpart. Pointers are renamed (one unique address per allocation); streams are kept.

Why: a recorded trace holds 8 steps, so a policy that is still settling in its second half
looks the same as one that drifts for ever. Replaying the lengthened trace tells them apart:
a policy that has converged makes no provider call, and reserves nothing more, in the added
steps (tests/test_convergence.py).
"""
import csv
import gzip
import io
import pickle
import sys


def read_events(path):
    """[(kind 'a' or 'f', address, size, stream)] of a trace."""
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:1] == b"\x80":  # a pickle: torch.cuda.memory._snapshot()
        trace = pickle.loads(raw)["device_traces"][0]
        return [("a" if e["action"] == "alloc" else "f", e["addr"], e["size"], str(e["stream"]))
                for e in trace if e["action"] in ("alloc", "free_completed")]
    rows = csv.reader(io.StringIO(raw.decode()))
    head = next(rows)
    col = {name: i for i, name in enumerate(head)}
    out = []
    for r in rows:
        act = r[col["Action"]]
        if act not in ("allocate", "free"):
            continue
        out.append(("a" if act == "allocate" else "f", int(r[col["Pointer"]], 0),
                    int(r[col["Size"]]), r[col["Stream"]]))
    return out


def period(events):
    sig = [(k, s) for k, _, s, _ in events]
    n = len(sig)
    for p in range(max(1, n // 12), n // 3 + 1):
        if sig[n - p:] == sig[n - 2 * p:n - p]:
            return p
    return None


def lengthen(events, reps):
    n = len(events)
    p = period(events)
    if p is None:
        raise ValueError("no repeating last step found")
    start = n - p
    ids, live, made = [], {}, {}  # the allocation each event is about; where it was made
    for i, (kind, addr, _, _) in enumerate(events):
        if kind == "a":
            live[addr] = ("t", i)
            made[("t", i)] = i
        elif addr not in live:
            raise ValueError("event %d frees an address not allocated" % (i + 1))
        ids.append(live[addr] if kind == "a" else live.pop(addr))
    out = list(zip(events, ids))
    for r in range(reps):
        for j in range(p):
            i = start + j
            kind = events[i][0]
            if kind == "a":
                ident = ("r", r, i)
            else:
                at = made[ids[i]]
                if at >= start:  # made in this step: this repetition's
                    ident = ("r", r, at)
                elif r == 0:  # made one step earlier: the original trace's counterpart
                    ident = ids[at + p]
                else:  # ... or the previous repetition's
                    ident = ("r", r - 1, at + p)
            out.append((events[i], ident))
    return out, p


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip())
    if not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
        sys.exit("lengthen_trace.py: N must be a positive number of steps, not %r" % sys.argv[3])
    try:
        events = read_events(sys.argv[1])
    except (OSError, EOFError, ValueError, KeyError, IndexError, StopIteration,
            pickle.UnpicklingError, UnicodeDecodeError) as e:
        sys.exit("lengthen_trace.py: %s: cannot read the trace: %s" % (sys.argv[1], e or type(e).__name__))
    try:
        out, p = lengthen(events, int(sys.argv[3]))
    except ValueError as e:
        sys.exit("lengthen_trace.py: %s: %s" % (sys.argv[1], e))
    address = {}
    with gzip.open(sys.argv[2], "wt") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for t, ((kind, _, size, stream), ident) in enumerate(out):
            a = address.setdefault(ident, (1 << 44) + (len(address) << 32))
            f.write("0,%d,%s,0x%x,%d,%s\n" % (t, "allocate" if kind == "a" else "free", a, size,
                                             stream))
    print("%s: step of %d events, %d events in all" % (sys.argv[2], p, len(out)))


if __name__ == "__main__":
    main()
