#!/usr/bin/env python3
"""End-to-end tests of the stash-replay command-line tool.

    test_replay_cli.py PATH/TO/stash-replay PATH/TO/data

Runs the binary on hand-made and real traces and checks its JSON and table output, its
exit codes and its error messages. Standard library only. Exits non-zero if any test fails.
"""
import csv
import gzip
import io
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import traceback

BIN = None
DATA = None
TMP = None

HEADER = "Thread,Time,Action,Pointer,Size,Stream"
PT = "policy:pytorch"
PT_EXP = "policy:pytorch,expandable_segments:True"
JSON_KEYS = ("trace", "conf", "events", "peak_live_bytes", "peak_reserved_bytes",
             "peak_allocated_bytes", "device_allocs", "device_frees", "ooms", "ns_per_event")
GiB = 1 << 30
MiB = 1 << 20


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def check_eq(got, want, what):
    if got != want:
        raise Failure("%s: got %r, want %r" % (what, got, want))


def run(*args, timeout=300):
    p = subprocess.run([BIN] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def describe(rc, out, err):
    return "rc=%d\n--- stdout:\n%s--- stderr:\n%s" % (rc, out[-3000:], err[-3000:])


def check_no_crash(rc, out, err):
    # A negative return code is death by a signal (SIGSEGV, SIGABRT from a sanitizer ...).
    check(rc >= 0, "killed by signal %d\n%s" % (-rc, describe(rc, out, err)))
    check("AddressSanitizer" not in err and "runtime error:" not in err,
          "sanitizer report\n" + describe(rc, out, err))


_n = [0]


def write(name, text=None, data=None, gz=False):
    """Write a file under a fresh directory of TMP (so each file has the given base name)."""
    _n[0] += 1
    d = os.path.join(TMP, "f%d" % _n[0])
    os.mkdir(d)
    path = os.path.join(d, name)
    if data is None:
        data = text.encode()
    if gz:
        data = gzip.compress(data)
    with open(path, "wb") as f:
        f.write(data)
    return path


def trace_text(rows, header=HEADER):
    """rows: (action, pointer, size, stream) tuples or raw strings."""
    lines = [header]
    for i, r in enumerate(rows):
        if isinstance(r, str):
            lines.append(r)
        else:
            action, ptr, size, stream = r
            lines.append("0,00:00:%02d.%06d,%s,%s,%s,%s" % (i // 1000000 % 60, i % 1000000,
                                                            action, ptr, size, stream))
    return "\n".join(lines) + "\n"


def json_lines(out):
    res = []
    for line in out.splitlines():
        if not line.strip():
            continue
        try:
            res.append(json.loads(line))
        except ValueError as e:
            raise Failure("not a JSON line: %r (%s)" % (line, e))
    return res


def replay_json(path, *args, confs=(PT,)):
    cargs = []
    for c in confs:
        cargs += ["--conf", c]
    rc, out, err = run("--json", *cargs, *args, path)
    check_no_crash(rc, out, err)
    check_eq(rc, 0, "exit status of --json replay of %s\n%s" % (path, describe(rc, out, err)))
    objs = json_lines(out)
    check_eq(len(objs), len(confs), "number of JSON lines\n" + describe(rc, out, err))
    for o in objs:
        for k in JSON_KEYS:
            check(k in o, "JSON line lacks key %r: %r" % (k, o))
    return objs, err


def expect_error(path, *patterns, args=(), rc_want=None):
    """The replay of path must fail cleanly: rc > 0, and stderr matches every pattern."""
    rc, out, err = run(*args, path)
    check_no_crash(rc, out, err)
    check(rc > 0, "expected a non-zero exit\n" + describe(rc, out, err))
    if rc_want is not None:
        check_eq(rc, rc_want, "exit status\n" + describe(rc, out, err))
    check(os.path.basename(path) in err, "stderr does not name the file %s\n%s"
          % (path, describe(rc, out, err)))
    for p in patterns:
        check(re.search(p, err), "stderr does not match /%s/\n%s" % (p, describe(rc, out, err)))
    check(len(err) < 2000, "stderr is not a short message\n" + describe(rc, out, err))
    return rc, out, err


def hand_model(rows):
    """What the reader should make of rows: (events, peak_live). Frees of pointers not
    live are skipped, "allocate failure" rows are skipped."""
    live = {}
    cur = peak = events = 0
    for action, ptr, size, _stream in rows:
        p = int(ptr, 16)
        if action == "allocate":
            live[p] = int(size)
            cur += int(size)
            peak = max(peak, cur)
            events += 1
        elif action == "free":
            if p in live:
                cur -= live.pop(p)
                events += 1
    return events, peak


# A small two-stream trace; peak live is 3000+5000+700 after row 4, then 5000+700+20000.
SMALL = [
    ("allocate", "0x7f0000000000", 3000, "0x0"),
    ("allocate", "0x7f0000200000", 5000, "0x1234"),
    ("allocate", "0x7f0000400000", 700, "0x0"),
    ("free", "0x7f0000000000", 3000, "0x0"),
    ("allocate", "0x7f0000600000", 20000, "0x1234"),
    ("free", "0x7f0000200000", 5000, "0x1234"),
    ("free", "0x7f0000400000", 700, "0x0"),
    ("free", "0x7f0000600000", 20000, "0x1234"),
]

# ------------------------------------------------------------------------------------------


def test_small_trace_json():
    path = write("small.csv", trace_text(SMALL))
    events, peak = hand_model(SMALL)
    check_eq((events, peak), (8, 25700), "hand model of SMALL (test bug)")
    (o,), err = replay_json(path)
    check_eq(o["trace"], "small.csv", "trace")
    check_eq(o["conf"], PT, "conf")
    check_eq(o["events"], events, "events")
    check_eq(o["peak_live_bytes"], peak, "peak_live_bytes")
    check_eq(o["ooms"], 0, "ooms")
    if "streams" in o:
        check_eq(o["streams"], 2, "streams")
    # Each allocation is rounded to 512 bytes; all four are small (< 1 MiB).
    check(o["peak_allocated_bytes"] >= peak, "peak_allocated_bytes < peak_live_bytes: %r" % o)
    check(o["peak_reserved_bytes"] >= o["peak_allocated_bytes"], "reserved < allocated: %r" % o)
    check(o["device_allocs"] >= 2, "two streams need two small segments: %r" % o)
    check(isinstance(o["ns_per_event"], (int, float)) and o["ns_per_event"] >= 0,
          "ns_per_event: %r" % o)
    check_eq(err, "", "stderr of a clean replay")


def test_one_small_allocation_pytorch():
    path = write("one.csv", trace_text([("allocate", "0x7f0000000000", 1000, "0x0")]))
    (o,), _ = replay_json(path)
    check_eq(o["events"], 1, "events")
    check_eq(o["peak_live_bytes"], 1000, "peak_live_bytes")
    check_eq(o["peak_reserved_bytes"], 2097152, "peak_reserved_bytes (one 2 MiB small segment)")
    check_eq(o["peak_allocated_bytes"], 1024, "peak_allocated_bytes (512-byte rounding)")
    check_eq(o["device_allocs"], 1, "device_allocs")
    check_eq(o["device_frees"], 0, "device_frees")
    check_eq(o["ooms"], 0, "ooms")


def test_check_mode_same_result():
    path = write("small.csv", trace_text(SMALL))
    (a,), _ = replay_json(path)
    (b,), _ = replay_json(path, "--check", "1")
    a.pop("ns_per_event")
    b.pop("ns_per_event")
    check_eq(b, a, "--check 1 result vs plain result")


def test_gzip_same_as_plain():
    text = trace_text(SMALL)
    plain = write("small.csv", text)
    gz = write("small.csv", text, gz=True)
    with open(gz, "rb") as f:
        check_eq(f.read(2), b"\x1f\x8b", "gzip magic (test bug)")
    a, _ = replay_json(plain, confs=(PT, PT_EXP))
    b, _ = replay_json(gz, confs=(PT, PT_EXP))
    for x in a + b:
        x.pop("ns_per_event")
    check_eq(b, a, "JSON of the gzip-compressed trace vs the plain one")


def test_repeated_conf_order():
    path = write("small.csv", trace_text(SMALL))
    confs = (PT_EXP, PT, "policy:pytorch,max_split_size_mb:20", PT)
    objs, _ = replay_json(path, confs=confs)
    check_eq([o["conf"] for o in objs], list(confs), "conf of each JSON line, in order")
    for o in objs:
        check_eq(o["trace"], "small.csv", "trace")
        check_eq(o["events"], 8, "events")
    check_eq(objs[1], dict(objs[3], ns_per_event=objs[1]["ns_per_event"]),
             "the same configuration twice gives the same result")


def test_several_traces():
    a = write("a.csv", trace_text(SMALL))
    b = write("b.csv", trace_text([("allocate", "0x7f0000000000", 1000, "0x0")]))
    rc, out, err = run("--json", "--conf", PT, "--conf", PT_EXP, a, b)
    check_eq(rc, 0, "exit\n" + describe(rc, out, err))
    objs = json_lines(out)
    check_eq([(o["trace"], o["conf"]) for o in objs],
             [("a.csv", PT), ("a.csv", PT_EXP), ("b.csv", PT), ("b.csv", PT_EXP)],
             "(trace, conf) of each line")
    check_eq([o["events"] for o in objs], [8, 8, 1, 1], "events")


def test_bad_trace_among_good_ones():
    good = write("good.csv", trace_text(SMALL))
    bad = write("bad.csv", "a,b,c\n1,2,3\n")
    rc, out, err = run("--json", "--conf", PT, good, bad, good)
    check_no_crash(rc, out, err)
    check(rc > 0, "a bad trace must make the exit non-zero\n" + describe(rc, out, err))
    check("bad.csv" in err, "stderr names the bad trace\n" + describe(rc, out, err))
    objs = json_lines(out)
    check_eq([o["trace"] for o in objs], ["good.csv", "good.csv"],
             "the good traces are still replayed\n" + describe(rc, out, err))


def test_json_escapes_trace_name():
    name = 'we"ird\\name.csv'
    path = write(name, trace_text(SMALL))
    (o,), _ = replay_json(path)
    check_eq(o["trace"], name, "trace name with a quote and a backslash")


def test_table_output():
    path = write("small.csv", trace_text(SMALL))
    confs = (PT, PT_EXP, "policy:pytorch,max_split_size_mb:20")
    args = []
    for c in confs:
        args += ["--conf", c]
    rc, out, err = run(*args, path)
    check_no_crash(rc, out, err)
    check_eq(rc, 0, "exit\n" + describe(rc, out, err))
    check("small.csv" in out, "table names the trace\n" + out)
    check(not out.lstrip().startswith("{"), "table output is not JSON\n" + out)
    rows = {}
    for line in out.splitlines():
        for c in confs:
            m = re.match(r"^([ *]) (\S+)\s+(\d+)\s", line)
            if m and m.group(2) == c:
                rows[c] = m
    for c in confs:
        check(c in rows, "table has no row for %r\n%s" % (c, out))
    starred = [c for c in confs if rows[c].group(1) == "*"]
    check_eq(len(starred), 1, "rows marked '*'\n" + out)
    # '*' marks the least reserved.
    least = min(int(rows[c].group(3)) for c in confs)
    check_eq(int(rows[starred[0]].group(3)), least, "the '*' row reserves the least\n" + out)
    # The table's numbers are those of --json.
    objs, _ = replay_json(path, confs=confs)
    for o in objs:
        check_eq(int(rows[o["conf"]].group(3)), o["peak_reserved_bytes"],
                 "table's peak reserved for %s" % o["conf"])
        # ... and its other columns: dev+ dev- driver-ms late OOMs ns/event
        cols = rows[o["conf"]].string.split()[-6:]
        check_eq(int(cols[0]), o["device_allocs"], "table's dev+ for %s" % o["conf"])
        check_eq(cols[2], "%.2f" % (o["modeled_driver_us"] / 1000.0),
                 "table's driver ms for %s" % o["conf"])
        check_eq(int(cols[3]), o["device_allocs_second_half"] + o["device_frees_second_half"],
                 "table's late calls for %s" % o["conf"])
        check_eq(int(cols[4]), o["ooms"], "table's OOMs for %s" % o["conf"])


# ---- --explain --------------------------------------------------------------------------

EXPLAIN_LINE = re.compile(
    r"event (\d+) \(line (\d+)\): ([\d.]+) MiB on stream (\d+): (?:reserved ([\d.]+) -> ([\d.]+) "
    r"MiB \(\+([\d.]+)\)|out of memory at ([\d.]+) MiB reserved); live before it ([\d.]+) MiB, "
    r"free ([\d.]+) MiB in (\d+) (small|large)-pool blocks, the largest ([\d.]+) MiB$")


PEAK_LINE = re.compile(
    r"at the peak \(after event (\d+)\), (small|large) pool: ([\d.]+) MiB reserved in (\d+) "
    r"segments? = ([\d.]+) live \+ ([\d.]+) rounding \+ ([\d.]+) pending free \+ ([\d.]+) lent "
    r"to stitched blocks \(([\d.]+) asked for\) \+ ([\d.]+) in (\d+) holes? \(the largest "
    r"([\d.]+)\) \+ ([\d.]+) free at (\d+) segment ends?$")


def explain(path, *args, confs=(PT,), peaks=None):
    """stash-replay --explain on path: {conf: [growth match, ...]}, and the JSON lines; the
    lines on the peak, {conf: {pool: match}}, into `peaks` if given."""
    out_path = os.path.join(TMP, "explain.txt")
    rc, out, err = run("--json", "--explain", out_path, *sum([["--conf", c] for c in confs], []),
                       *args, path)
    check_no_crash(rc, out, err)
    sections, conf = {}, None
    for line in open(out_path):
        line = line.rstrip("\n")
        if line.startswith("# "):
            conf = line.split(" under ", 1)[1]
            sections[conf] = []
            continue
        m = PEAK_LINE.match(line)
        if m and conf is not None:
            if peaks is not None:
                peaks.setdefault(conf, {})[m.group(2)] = m
            continue
        m = EXPLAIN_LINE.match(line)
        check(m is not None and conf is not None, "unexpected --explain line %r" % line)
        sections[conf].append(m)
    return sections, json_lines(out)


def test_explain_accounts_for_the_peak():
    # By hand, PyTorch's default: A 30 MiB (a segment of its own), B 6 MiB (a 20 MiB
    # segment), C 13.5 MiB into B's segment's last 14 MiB (not split: the 0.5 MiB left is not
    # over 1 MiB), B freed (a 6 MiB hole below C), D 40 MiB (a third segment): the peak, 90
    # MiB = 83.5 live + 0.5 rounding + 6 in one hole.
    path = write("explain-peak.csv", trace_text([
        ("allocate", "0xa000", 30 * MiB, "0x0"), ("allocate", "0xb000", 6 * MiB, "0x0"),
        ("allocate", "0xc000", 27 * MiB // 2, "0x0"), ("free", "0xb000", 6 * MiB, "0x0"),
        ("allocate", "0xd000", 40 * MiB, "0x0")]))
    peaks = {}
    explain(path, peaks=peaks)
    check_eq(sorted(peaks.get(PT, {})), ["large"], "pools with memory at the peak")
    if "large" in peaks.get(PT, {}):
        check_eq(peaks[PT]["large"].groups(),
                 ("5", "large", "90.0", "3", "83.5", "0.5", "0.0", "0.0", "0.0", "6.0", "1",
                  "6.0", "0.0", "0"), "the peak's account")
    # On recorded traces: the terms add up to each pool's reserved bytes, and the pools to the
    # peak the JSON reports; policy:stash's stitched blocks show as lent on Llama.
    confs = (PT, PT_EXP, "policy:stash")
    for name in ("resnet50_train.csv.gz", "hf/llama_b8.csv.gz"):
        peaks = {}
        _, rows = explain(os.path.join(DATA, "traces", name), confs=confs, peaks=peaks)
        for row in rows:
            pools = peaks.get(row["conf"], {})
            check(pools, "%s %s: no line on the peak" % (name, row["conf"]))
            total = 0.0
            for m in pools.values():
                terms = [float(m.group(k)) for k in (5, 6, 7, 8, 10, 13)]
                check(abs(sum(terms) - float(m.group(3))) < 0.35,
                      "%s %s: %r does not add up" % (name, row["conf"], m.group(0)))
                total += float(m.group(3))
            check(abs(total * MiB - row["peak_reserved_bytes"]) < 0.11 * MiB,
                  "%s %s: pools %.1f MiB, peak %d" % (name, row["conf"], total,
                                                     row["peak_reserved_bytes"]))
        lent = peaks.get("policy:stash", {}).get("large")
        if name.startswith("hf/") and lent:
            check(float(lent.group(8)) >= 1000.0, "llama_b8: stitched blocks lent %s MiB" %
                  lent.group(8))


def test_explain_names_every_growth_of_pytorch_default():
    # Under PyTorch's default every growth of reserved bytes is one cudaMalloc: as many lines
    # as PyTorch itself counted device allocations on the real run (anchors.json), and the
    # growths add up to the peak (nothing is freed back).
    anchors = json.load(open(os.path.join(DATA, "traces", "anchors.json")))
    for name in ("resnet50_train", "gpt2_train"):
        sections, rows = explain(os.path.join(DATA, "traces", name + ".csv.gz"))
        lines = sections[PT]
        check_eq(len(lines), anchors[name]["pytorch"][""]["device_allocs"],
                 "%s: --explain lines" % name)
        check_eq(len(lines), rows[0]["device_allocs"], "%s: lines vs JSON device_allocs" % name)
        check_eq(int(lines[0].group(1)), 1, "%s: the first allocation grows" % name)
        total = sum(float(m.group(7)) for m in lines)
        check(abs(total * (1 << 20) - rows[0]["peak_reserved_bytes"]) < len(lines) * 0.06 * (1 << 20),
              "%s: growths add up to %.1f MiB, peak %d" % (name, total, rows[0]["peak_reserved_bytes"]))
        for m in lines:  # reserved after = before + growth; a large request, a large pool
            check(abs(float(m.group(6)) - float(m.group(5)) - float(m.group(7))) < 0.15,
                  "inconsistent line %r" % m.group(0))
            check_eq(m.group(12) == "small", float(m.group(3)) <= 1.0, "pool of %r" % m.group(0))


def test_html_states_the_peak_account():
    # The page says, under each setting's layout, what --explain says of the peak.
    page = os.path.join(TMP, "account.html")
    path = os.path.join(DATA, "traces", "resnet50_train.csv.gz")
    confs = ("policy:stash", PT)
    rc, out, err = run("--html", page, *sum([["--conf", c] for c in confs], []), path)
    check_no_crash(rc, out, err)
    html = open(page).read() if os.path.exists(page) else ""
    got = re.findall(r"<p class='note account'>([^<]*)</p>", html)
    peaks = {}
    explain(path, confs=confs, peaks=peaks)
    want = [peaks[c][pool].group(0).split("), ", 1)[1] for c in confs
            for pool in ("small", "large") if pool in peaks.get(c, {})]
    check(len(want) == 4, "--explain: a line per pool and setting, got %d" % len(want))
    check_eq(got, want, "the page's account of the peak")


def test_explain_reports_out_of_memory():
    path = write("explain-oom.csv", trace_text([
        ("allocate", "0x1000", 3 * GiB, "0x0"), ("allocate", "0x2000", 3 * GiB, "0x0")]))
    sections, rows = explain(path, "--capacity", "4GiB", confs=(PT, "policy:stash"))
    for conf in (PT, "policy:stash"):
        lines = sections[conf]
        check_eq(len(lines), 2, "%s: lines" % conf)
        check(lines[0].group(7) is not None and lines[1].group(8) is not None,
              "%s: a growth, then out of memory: %r" % (conf, [m.group(0) for m in lines]))
        check_eq(float(lines[1].group(9)), 3072.0, "%s: live before the failed request" % conf)


def test_explain_unwritable():
    rc, out, err = run("--explain", os.path.join(TMP, "no-such-dir", "x.txt"),
                       os.path.join(DATA, "traces", "resnet50_train.csv.gz"))
    check_eq(rc, 2, "exit code")
    check("--explain: cannot write" in err, "message: %r" % err)


def test_output_that_is_a_trace_is_refused():
    # "--explain TRACE" (the file forgotten) would overwrite the trace with the explanation:
    # refused before anything is written, and the trace is left as it was.
    with open(os.path.join(DATA, "traces", "resnet50_train.csv.gz"), "rb") as f:
        data = f.read()
    path = write("keep-me.csv.gz", data=data)
    other = write("other.csv.gz", data=data)
    link = os.path.join(TMP, "link-to-keep-me.csv.gz")
    os.symlink(path, link)
    for args, pattern in [
            (("--explain", path, other, path), "--explain '%s' is also a trace" % path),
            (("--explain", link, path), "--explain '%s' is also a trace" % link),
            (("--html", path, other, path), "--html '%s' is also a trace" % path),
            (("--explain", os.path.join(TMP, "out.txt"), "--html",
              os.path.join(TMP, "out.txt"), path), "--explain and --html both write")]:
        rc, out, err = run(*args)
        check_eq(rc, 2, "exit code of %r" % (args,))
        check(pattern in err, "message of %r: %r" % (args, err))
        with open(path, "rb") as f:
            check(f.read() == data, "%r changed the trace" % (args,))
    check(not os.path.exists(os.path.join(TMP, "out.txt")), "nothing written")
    # an explanation written to a new file, next to the same trace, is fine
    rc, out, err = run("--explain", os.path.join(TMP, "fine.txt"), "--conf", PT, path)
    check_eq(rc, 0, "exit code with a fresh --explain file: %s" % err)


def test_output_that_names_another_trace_or_an_option_is_refused():
    # "--explain TRACE" with no other trace replays the default trace and, before this check,
    # wrote the explanation over TRACE; "--explain --conf ..." wrote a file named "--conf".
    # Each is refused before anything is written, and every file is left as it was.
    with open(os.path.join(DATA, "traces", "resnet50_train.csv.gz"), "rb") as f:
        gz = f.read()
    csv = "Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x1000,512,0x0\n"
    import pickle as _pk
    traces = {"lone.csv.gz": gz, "lone.csv": csv.encode(),
              "lone.pickle": _pk.dumps({"device_traces": []}, protocol=4)}
    cwd = os.getcwd()
    os.chdir(TMP)
    try:
        paths = {}
        for name, data in traces.items():
            path = paths[name] = write(name, data=data)
            for opt in ("--explain", "--html"):
                rc, out, err = run(opt, path, "--conf", PT)
                check_eq(rc, 2, "exit code of %s %s" % (opt, name))
                check("%s '%s' is a trace file" % (opt, path) in err, "message: %r" % err)
                with open(path, "rb") as f:
                    check(f.read() == data, "%s %s changed the file" % (opt, name))
        for opt in ("--explain", "--html"):
            rc, out, err = run(opt, "--conf", PT, os.path.join(DATA, "traces", "resnet50_train.csv.gz"))
            check_eq(rc, 2, "exit code of %s --conf" % opt)
            check("%s '--conf' looks like an option" % opt in err, "message: %r" % err)
            check(not os.path.exists(os.path.join(TMP, "--conf")), "%s wrote a file '--conf'" % opt)
        rc, out, err = run("--html", "-", "--conf", PT, paths["lone.csv"])
        check_eq(rc, 2, "exit code of --html -")
        check("--html needs a file to write, not '-'" in err, "message: %r" % err)
        check(not os.path.exists(os.path.join(TMP, "-")), "--html - wrote a file named '-'")
        # an earlier explanation or page is not a trace: writing it again is fine
        out_path = write("again.txt", data=b"at the peak ...\n")
        rc, out, err = run("--explain", out_path, "--conf", PT, paths["lone.csv"])
        check_eq(rc, 0, "exit code rewriting an earlier explanation: %s" % err)
    finally:
        os.chdir(cwd)


# ---- --calls ----------------------------------------------------------------------------

CALL_LINE = re.compile(r"^(?:event (\d+) \(line (\d+), (alloc|free) ([\d.]+) MiB\)|creating the heap):"
                       r" (.*); ([\d.]+) us, ([\d.]+) so far$")
CALL_ITEM = re.compile(r"^(\w+) (\d+)(?: \(([\d.]+) MiB\))? ([\d.]+) us$")


def calls(path, *args, confs=(PT,)):
    """stash-replay --json --calls on path: {conf: section}, {conf: JSON line}; a section is
    {"events": [(event, line, what, MiB, {kind: (n, us)}, us, so_far)], "total": (us, n),
    "by_kind": {kind: (n, us)}, "tenths": [us x 10], "top": [(event, us)]}."""
    out_path = os.path.join(TMP, "calls.txt")
    rc, out, err = run("--json", "--calls", out_path, *sum([["--conf", c] for c in confs], []),
                       *args, path)
    check_eq(rc, 0, "exit code: %s" % err)
    rows = {json.loads(l)["conf"]: json.loads(l) for l in out.splitlines()}
    sections, cur = {}, None
    with open(out_path) as f:
        for line in f.read().splitlines():
            if line.startswith("# "):
                conf = line.split(" under ", 1)[1]
                cur = sections[conf] = {"events": [], "by_kind": {}, "top": []}
                continue
            m = CALL_LINE.match(line)
            if m:
                items = {}
                for it in m.group(5).split(", "):
                    mi = CALL_ITEM.match(it)
                    check(mi is not None, "unexpected call item %r in %r" % (it, line))
                    items[mi.group(1)] = (int(mi.group(2)), float(mi.group(4)))
                ev = int(m.group(1)) if m.group(1) else 0
                cur["events"].append((ev, int(m.group(2) or 0), m.group(3),
                                      float(m.group(4) or 0), items, float(m.group(6)),
                                      float(m.group(7))))
            elif line.startswith("total "):
                m = re.match(r"^total \(modelled on an H200\): ([\d.]+) us in (\d+) calls$", line)
                check(m is not None, "bad total line %r" % line)
                cur["total"] = (float(m.group(1)), int(m.group(2)))
            elif line.startswith("by kind: "):
                for it in line[len("by kind: "):].split(", "):
                    m = re.match(r"^(\w+) (\d+) calls? ([\d.]+) us \([\d.]+%\)$", it)
                    check(m is not None, "bad by-kind item %r" % it)
                    cur["by_kind"][m.group(1)] = (int(m.group(2)), float(m.group(3)))
            elif line.startswith("by tenth of the trace's events, us: "):
                cur["tenths"] = [float(x) for x in line.split(": ", 1)[1].split()]
            elif line.startswith("costliest events: "):
                for it in line[len("costliest events: "):].split(", "):
                    m = re.match(r"^event (\d+) \(line \d+\) ([\d.]+) us$", it)
                    check(m is not None, "bad costliest item %r" % it)
                    cur["top"].append((int(m.group(1)), float(m.group(2))))
            else:
                raise Failure("unexpected --calls line %r" % line)
    return sections, rows


def check_calls_section(name, sec, row):
    """Every microsecond of the JSON's modeled_driver_us, and every call it counts, on one
    line of the section."""
    events = sec["events"]
    evs = [e[0] for e in events]
    check(evs == sorted(set(evs)), "%s: events not in order, or one twice" % name)
    check(all(1 <= e <= row["events"] for e in evs[1:]) and evs[0] in (0, 1),
          "%s: an event number out of range" % name)
    so_far = 0.0
    for ev, line, what, mib, items, us, acc in events:
        check(abs(sum(u for _, u in items.values()) - us) <= 0.05 * len(items) + 1e-9,
              "%s: event %d's calls do not add up to its %.1f us" % (name, ev, us))
        so_far += us
        check(abs(so_far - acc) <= 0.05 * len(events), "%s: event %d's running total" % (name, ev))
    total_us, total_n = sec["total"]
    check(abs(total_us - row["modeled_driver_us"]) <= 0.051,
          "%s: total %.1f us, JSON %.3f" % (name, total_us, row["modeled_driver_us"]))
    check(abs(sum(e[5] for e in events) - total_us) <= 0.05 * len(events) + 0.05,
          "%s: the events' lines add up to the total" % name)
    want = {k: v for k, v in row["calls"].items() if v[0]}
    check_eq({k: v[0] for k, v in sec["by_kind"].items()}, {k: v[0] for k, v in want.items()},
             "%s: calls by kind against the JSON" % name)
    for k, (n, us) in sec["by_kind"].items():
        check(abs(us - want[k][1]) <= 0.051, "%s: %s's us against the JSON" % (name, k))
        check_eq(sum(e[4].get(k, (0, 0))[0] for e in events), n, "%s: %s calls over the lines" % (name, k))
    check_eq(total_n, sum(v[0] for v in want.values()), "%s: the total's calls" % name)
    check(abs(sum(sec["tenths"]) - total_us) <= 0.5, "%s: the tenths add up to the total" % name)
    costs = sorted((e[5] for e in events if e[0]), reverse=True)[:5]
    check_eq([t[1] for t in sec["top"]], costs, "%s: the costliest events" % name)


def test_calls_account_for_the_driver_time():
    # --calls puts each provider call, with its share of modeled_driver_us, on the line of the
    # event that made it: the lines add up to the JSON's figure and its counts, call for call.
    name = "resnet50_train.csv.gz"
    path = os.path.join(DATA, "traces", name)
    confs = ("policy:stash", PT, PT_EXP)
    sections, rows = calls(path, confs=confs)
    for c in confs:
        check_calls_section("%s under %s" % (name, c), sections[c], rows[c])
        # a CSV trace's event n is on line n + 1 (the header is line 1)
        check(all(e[1] == e[0] + 1 for e in sections[c]["events"] if e[0]),
              "%s: an event's line" % c)
    # the decisions are the same with the log as without
    rc, out, err = run("--json", *sum([["--conf", c] for c in confs], []), path)
    for l in out.splitlines():
        r = json.loads(l)
        for k in ("peak_reserved_bytes", "device_allocs", "modeled_driver_us", "calls"):
            check_eq(rows[r["conf"]][k], r[k], "%s under %s without --calls" % (k, r["conf"]))
    # policy:pytorch's default makes one cudaMalloc per new segment: each on the event whose
    # allocation found no cached block, and nothing else after creating the heap
    pt = sections[PT]["events"]
    check(all(set(e[4]) == {"mem_alloc"} and e[2] == "alloc" for e in pt[1:]),
          "policy:pytorch: only allocations call, and only cudaMalloc")


def test_calls_on_two_streams_and_empty_cache():
    # Events on a second stream, and empty_cache between steps: the calls of a free (unmap,
    # release, cudaFree) are on that free's line.
    rows = []
    for step in range(3):
        rows += [("allocate", "0x%x" % (0x10000000 * (i + 1)), (64 + 32 * i) * MiB, "0x0" if i % 2 else "0x7")
                 for i in range(6)]
        rows += [("free", "0x%x" % (0x10000000 * (i + 1)), (64 + 32 * i) * MiB, "0x0" if i % 2 else "0x7")
                 for i in range(6)]
    path = write("calls-streams.csv", trace_text(rows))
    confs = ("policy:stash", PT, PT_EXP)
    sections, out_rows = calls(path, "--empty-cache-between-steps", confs=confs)
    for c in confs:
        check_calls_section("under %s" % c, sections[c], out_rows[c])
        freeing = [e for e in sections[c]["events"] if e[2] == "free"]
        check(freeing and all(set(e[4]) & {"unmap", "phys_release", "mem_free"} for e in freeing),
              "%s: empty_cache's calls on the free that made it" % c)


def test_series():
    # --series N: live and reserved bytes, and (simulated) the modelled driver time so far,
    # in N buckets of events, each at the event where its reserved bytes were highest.
    rows = []
    for step in range(3):
        rows += [("allocate", "0x%x" % (0x10000000 * (i + 1)), (64 + 32 * i) * MiB, "0x0")
                 for i in range(5)]
        rows += [("free", "0x%x" % (0x10000000 * (i + 1)), (64 + 32 * i) * MiB, "0x0")
                 for i in range(5)]
    path = write("series.csv", trace_text(rows))
    for conf in ("policy:stash", PT):
        rc, out, err = run("--json", "--series", 1000, "--conf", conf, path)
        check_eq(rc, 0, "exit code: %s" % err)
        r = json.loads(out)
        s = r["series"]
        n = len(rows)
        check_eq(s["event"], list(range(1, n + 1)), "%s: one point per event" % conf)
        live, want = 0, []
        for action, _, size, _ in rows:
            live += size if action == "allocate" else -size
            want.append(live)
        check_eq(s["live"], want, "%s: live bytes after each event" % conf)
        check_eq(max(s["reserved"]), r["peak_reserved_bytes"], "%s: reserved's peak" % conf)
        d = s["driver_us"]
        check(all(a <= b for a, b in zip(d, d[1:])), "%s: driver time never falls" % conf)
        check(d[0] >= 21.0, "%s: the heap's creation (cuMemGetInfo) comes first" % conf)
        check(abs(d[-1] - r["modeled_driver_us"]) <= 0.051, "%s: driver time at the end" % conf)
        # the events that made calls are the ones --calls lists
        sections, _ = calls(path, confs=(conf,))
        moved = ([1] if d[0] > 21.05 else []) + [i + 1 for i in range(1, n) if d[i] > d[i - 1]]
        listed = [e[0] for e in sections[conf]["events"] if e[0] and e[5] > 0.05]
        check_eq(sorted(moved), listed, "%s: events whose driver time grew" % conf)
    # buckets: 7 points for the shared trace; the peaks survive
    rc, out, err = run("--json", "--series", 7, "--conf", "policy:stash",
                       os.path.join(DATA, "traces", "resnet50_train.csv.gz"))
    r = json.loads(out)
    s = r["series"]
    check_eq([len(s[k]) for k in ("event", "live", "reserved", "driver_us")], [7] * 4, "lengths")
    check_eq(max(s["reserved"]), r["peak_reserved_bytes"], "reserved's peak in 7 points")
    check_eq(max(s["live"]), r["peak_live_bytes"], "live's peak in 7 points")
    check(all(a < b for a, b in zip(s["event"], s["event"][1:])), "events in order")


def test_calls_refused():
    trace = os.path.join(DATA, "traces", "resnet50_train.csv.gz")
    out_path = os.path.join(TMP, "refused-calls.txt")
    for args, pattern in [
            (("--calls", "-", "--explain", "-", trace), "--explain and --calls both write to stderr"),
            (("--calls", out_path, "--explain", out_path, trace), "--explain and --calls both write"),
            (("--calls", trace, "--conf", PT), "--calls '%s' is also a trace" % trace),
            (("--calls", "--conf", PT, trace), "--calls '--conf' looks like an option")]:
        rc, out, err = run(*args)
        check_eq(rc, 2, "exit code of %r" % (args,))
        check(pattern in err, "message of %r: %r" % (args, err))
    check(not os.path.exists(out_path), "nothing written")
    rc, out, err = run("--calls", os.path.join(TMP, "no-such-dir", "x.txt"), trace)
    check_eq(rc, 2, "exit code")
    check("--calls: cannot write" in err, "message: %r" % err)
    # '-': stderr, one section per configuration
    rc, out, err = run("--calls", "-", "--conf", PT, trace)
    check_eq(rc, 0, "exit code of --calls -: %s" % err)
    check(err.count("# resnet50_train.csv.gz under policy:pytorch") == 1 and "total (" in err,
          "--calls - writes to stderr: %r" % err[-500:])


# ---- bad inputs --------------------------------------------------------------------------


def test_nonexistent_file():
    path = os.path.join(TMP, "no-such-dir", "missing.csv")
    expect_error(path, r"missing\.csv")


def test_empty_file():
    expect_error(write("empty.csv", ""), r"empty")


def test_snapshots():
    import gzip as _gz
    import pickle as _pk
    real = os.path.join(DATA, "traces", "resnet50_train.snapshot.pickle.gz")
    objs, _ = replay_json(real, confs=(PT,))
    check_eq(objs[0]["events"], 4065, "events of the real snapshot (2034 allocs, 2031 frees)")
    check_eq(objs[0]["peak_live_bytes"], 6057040912, "peak live of the real snapshot")
    plain = write("snap.pickle", data=_gz.open(real).read())
    objs2, _ = replay_json(plain, confs=(PT,))
    check_eq(objs2[0]["peak_reserved_bytes"], objs[0]["peak_reserved_bytes"], "plain = gzip")
    # Bad snapshots: each a clear error naming the file, and a non-zero exit.
    expect_error(write("list.pickle", data=_pk.dumps([1, 2, 3], protocol=4)),
                 r"list\.pickle", r"not a PyTorch memory snapshot")
    expect_error(write("nohist.pickle", data=_pk.dumps({"segments": []}, protocol=4)),
                 r"nohist\.pickle", r"record_memory_history")
    whole = _pk.dumps({"device_traces": [[{"action": "alloc", "addr": 4096, "size": 10}]]}, protocol=4)
    expect_error(write("cut.pickle", data=whole[:len(whole) // 2]), r"cut\.pickle", r"byte \d+")
    expect_error(write("noaddr.pickle", data=_pk.dumps(
        {"device_traces": [[{"action": "alloc", "size": 10}]]}, protocol=4)),
        r"noaddr\.pickle", r"event 1\b")
    expect_error(write("set.pickle", data=_pk.dumps({"device_traces": {1, 2}}, protocol=4)),
                 r"set\.pickle", r"opcode|not a PyTorch")


def test_not_rmm_header():
    expect_error(write("hdr.csv", "a,b,c\n1,2,3\n"), r"hdr\.csv:1\b", r"(?i)header|rmm")


def test_wrong_field_count():
    text = trace_text(SMALL[:3] + ["0,00:00:01.000000,free,0x7f0000000000"] + SMALL[3:])
    expect_error(write("fields.csv", text), r"fields\.csv:5:")
    # Too many fields, and a line of a single field.
    text = trace_text(SMALL[:1] + ["0,t,allocate,0x7f0000400000,64,0x0,extra"])
    expect_error(write("fields2.csv", text), r"fields2\.csv:3:")
    text = trace_text(SMALL[:2] + ["garbage"])
    expect_error(write("fields3.csv", text), r"fields3\.csv:4:")


def test_bad_pointer():
    text = trace_text(SMALL[:2] + [("allocate", "0xZZ", 64, "0x0")])
    expect_error(write("ptr.csv", text), r"ptr\.csv:4:", r"0xZZ")
    text = trace_text([("allocate", "", 64, "0x0")])
    expect_error(write("ptr2.csv", text), r"ptr2\.csv:2:", r"(?i)pointer")


def test_bad_size():
    for i, bad in enumerate(("-5", "abc", "12abc", "", "99999999999999999999999")):
        name = "size%d.csv" % i
        text = trace_text([("allocate", "0x7f0000000000", 64, "0x0"),
                           ("allocate", "0x7f0000200000", bad, "0x0")])
        expect_error(write(name, text), re.escape(name) + r":3:", r"(?i)size")


def test_bad_stream():
    text = trace_text([("allocate", "0x7f0000000000", 64, "stream0")])
    expect_error(write("stream.csv", text), r"stream\.csv:2:", r"stream0")


def test_unknown_action():
    text = trace_text(SMALL[:4] + [("reallocate", "0x7f0000000000", 64, "0x0")])
    expect_error(write("action.csv", text), r"action\.csv:6:", r"reallocate")


def test_truncated_gzip():
    src = os.path.join(DATA, "traces", "resnet50_train.csv.gz")
    with gzip.open(src, "rb") as f:
        raw = f.read()
    comp = gzip.compress(raw)
    for frac in (2, 3, 7):
        name = "cut%d.csv.gz" % frac
        path = write(name, data=comp[:len(comp) // frac])
        # Whatever line the cut falls in, the message must say the file is cut short
        # (not blame a half line for having too few fields).
        expect_error(path, r"(?i)truncat|corrupt|unexpected end")
    # Cut just before the gzip trailer: all lines are there but the file is incomplete.
    expect_error(write("trailer.csv.gz", data=comp[:-4]), r"(?i)truncat|corrupt|unexpected end")


def test_corrupt_gzip():
    src = os.path.join(DATA, "traces", "resnet50_train.csv.gz")
    with gzip.open(src, "rb") as f:
        comp = bytearray(gzip.compress(f.read()))
    mid = len(comp) // 2
    for i in range(mid, mid + 64):
        comp[i] ^= 0x5A
    expect_error(write("corrupt.csv.gz", data=bytes(comp)))


def test_binary_garbage():
    rnd = random.Random(1234)
    data = bytes(rnd.randrange(256) for _ in range(20000))
    check(data[:2] != b"\x1f\x8b", "garbage looks like gzip (test bug)")
    expect_error(write("garbage.bin", data=data))
    # Garbage after a valid header: a line number is named.
    expect_error(write("garbage2.csv", data=(HEADER + "\n").encode() + data),
                 r"garbage2\.csv:\d+:")


def test_directory_as_trace():
    d = os.path.join(TMP, "adir.csv")
    os.mkdir(d)
    expect_error(d)


# ---- semantics ---------------------------------------------------------------------------


def test_free_of_unknown_pointer_warns():
    rows = SMALL[:3] + [("free", "0x7f00deadbe00", 64, "0x0")] + SMALL[3:]
    path = write("stray.csv", trace_text(rows))
    rc, out, err = run("--json", "--conf", PT, path)
    check_no_crash(rc, out, err)
    check_eq(rc, 0, "a stray free is not an error\n" + describe(rc, out, err))
    check(re.search(r"(?i)warn", err), "no warning\n" + describe(rc, out, err))
    check(re.search(r"stray\.csv:5\b", err), "warning names file:line\n" + describe(rc, out, err))
    (o,) = json_lines(out)
    events, peak = hand_model(rows)
    check_eq(events, 8, "hand model (test bug)")
    check_eq(o["events"], events, "events (the stray free is skipped)")
    check_eq(o["peak_live_bytes"], peak, "peak_live_bytes")


def test_double_free_warns():
    rows = SMALL[:4] + [("free", "0x7f0000000000", 3000, "0x0")] + SMALL[4:]
    path = write("double.csv", trace_text(rows))
    objs, err = replay_json(path)
    check(re.search(r"double\.csv:6\b", err), "warning names file:line 6\n" + err)
    check_eq(objs[0]["events"], 8, "events")
    check_eq(objs[0]["peak_live_bytes"], 25700, "peak_live_bytes")


def test_allocate_failure_skipped():
    rows = (SMALL[:2] + [("allocate failure", "0x0", 1 << 40, "0x0")] + SMALL[2:5] +
            [("allocate failure", "0x0", 123456789, "0x1234")] + SMALL[5:])
    path = write("failure.csv", trace_text(rows))
    (o,), err = replay_json(path)
    check_eq(o["events"], 8, "events (allocate failure rows are not events)")
    check_eq(o["peak_live_bytes"], 25700, "peak_live_bytes")
    check_eq(o["ooms"], 0, "ooms")
    (base,), _ = replay_json(write("small.csv", trace_text(SMALL)))
    o.pop("ns_per_event"), base.pop("ns_per_event"), o.pop("trace"), base.pop("trace")
    check_eq(o, base, "result with allocate failure rows vs without")


def test_crlf_and_blank_lines():
    text = trace_text(SMALL).replace("\n", "\r\n")
    (o,), _ = replay_json(write("crlf.csv", text))
    check_eq((o["events"], o["peak_live_bytes"]), (8, 25700), "CRLF trace")
    lines = trace_text(SMALL).split("\n")
    text = "\n".join(lines[:3] + [""] + lines[3:])
    (o,), _ = replay_json(write("blank.csv", text))
    check_eq((o["events"], o["peak_live_bytes"]), (8, 25700), "trace with a blank line")
    # The line number after a blank line still counts the blank line.
    bad = "\n".join(lines[:3] + ["", "0,t,allocate,0xZZ,1,0x0"] + lines[3:])
    expect_error(write("blank2.csv", bad), r"blank2\.csv:5:")


def test_columns_found_by_name():
    header = "Stream,Size,Pointer,Action,Time,Thread"
    rows = ["%s,%s,%s,%s,t,0" % (s, z, p, a) for a, p, z, s in SMALL]
    (o,), _ = replay_json(write("reordered.csv", trace_text(rows, header=header)))
    check_eq((o["events"], o["peak_live_bytes"]), (8, 25700), "trace with reordered columns")
    if "streams" in o:
        check_eq(o["streams"], 2, "streams")


def test_extreme_pointers():
    # Pointer 0 and the largest pointer are ordinary keys. The third pointer lands, in
    # stash-replay's pointer map, in the slot a key of 0 would take; peak live is 1100.
    rows = [
        ("allocate", "0xffffffffffffffff", 100, "0x0"),
        ("allocate", "0x7f000005f000", 1000, "0x0"),
        ("free", "0xffffffffffffffff", 100, "0x0"),
        ("allocate", "0x7f0000100000", 50, "0x0"),
        ("allocate", "0x0", 30, "0x0"),
        ("free", "0x7f000005f000", 1000, "0x0"),
        ("free", "0x7f0000100000", 50, "0x0"),
        ("free", "0x0", 30, "0x0"),
        ("allocate", "0xffffffffffffffff", 7, "0x0"),
        ("free", "0xffffffffffffffff", 7, "0x0"),
    ]
    # And many more pointers, so that some share slots with the extreme ones.
    for i in range(3000):
        rows.append(("allocate", hex(0x7e0000000000 + 512 * i), 1, "0x0"))
    for i in range(3000):
        rows.append(("free", hex(0x7e0000000000 + 512 * i), 1, "0x0"))
    events, peak = hand_model(rows)
    check_eq(peak, 3000, "hand model (test bug)")
    rows.insert(2, ("allocate", "0x7f0000300000", 2000, "0x0"))
    rows.insert(6, ("free", "0x7f0000300000", 2000, "0x0"))
    events, peak = hand_model(rows)
    check_eq(peak, 3100, "hand model (test bug)")
    (o,), err = replay_json(write("extreme.csv", trace_text(rows)), "--check", "1")
    check_eq(err, "", "stderr (no free is stray)")
    check_eq(o["events"], events, "events")
    check_eq(o["peak_live_bytes"], peak, "peak_live_bytes")
    check_eq(o["ooms"], 0, "ooms")


def test_capacity_values():
    path = write("small.csv", trace_text(SMALL))
    for v in ("1GiB", "1G", "1073741824"):
        (o,), _ = replay_json(path, "--capacity", v)
        check_eq(o["ooms"], 0, "ooms under --capacity %s" % v)
    for v in ("abc", "0", "", "1.5G", "-1G", "1X", "99999999999T"):
        rc, out, err = run("--capacity", v, "--json", path)
        check_no_crash(rc, out, err)
        check_eq(rc, 2, "exit of --capacity %r\n%s" % (v, describe(rc, out, err)))
        check("capacity" in err, "message names --capacity\n" + describe(rc, out, err))
        check_eq(out, "", "nothing replayed with a bad --capacity")
    rc, out, err = run(path, "--capacity")
    check_eq(rc, 2, "--capacity without a value\n" + describe(rc, out, err))


def test_capacity_oom():
    rows = [("allocate", hex(0x7f0000000000 + i * GiB), GiB, "0x0") for i in range(3)]
    rows += [("free", hex(0x7f0000000000 + i * GiB), GiB, "0x0") for i in range(3)]
    rows += [("allocate", "0x7f1000000000", 1000, "0x0")]
    path = write("big3.csv", trace_text(rows))
    objs, _ = replay_json(path, "--capacity", "1GiB", confs=(PT, PT_EXP))
    for o in objs:
        check_eq(o["peak_live_bytes"], 3 * GiB, "peak_live_bytes")
        check_eq(o["events"], 7, "events")
        check(0 < o["ooms"] <= 3, "ooms under 1 GiB for 3 GiB live: %r" % o)
        check(o["peak_reserved_bytes"] <= GiB, "reserved more than the capacity: %r" % o)
    # The same trace fits the default device.
    objs, _ = replay_json(path, confs=(PT, PT_EXP))
    for o in objs:
        check_eq(o["ooms"], 0, "ooms on the default device")
    # The table reports where the first one ran out.
    rc, out, err = run("--capacity", "1GiB", "--conf", PT, path)
    check_no_crash(rc, out, err)
    check_eq(rc, 0, "exit\n" + describe(rc, out, err))
    check(re.search(r"out of memory.*line [2-4]\b", out), "table names the OOM line\n" + out)


def test_absurd_sizes():
    rows = [
        ("allocate", "0x7f0000000000", 1000, "0x0"),
        ("allocate", "0x7f0000200000", 2 ** 64 - 1, "0x0"),
        ("allocate", "0x7f0000400000", 2 ** 62, "0x1234"),
        ("allocate", "0x7f0000600000", 2 ** 63 + 1, "0x0"),
        ("allocate", "0x7f0000800000", 2 ** 64 - 512, "0x0"),
        ("free", "0x7f0000200000", 0, "0x0"),
        ("free", "0x7f0000400000", 0, "0x1234"),
        ("free", "0x7f0000600000", 0, "0x0"),
        ("free", "0x7f0000800000", 0, "0x0"),
        ("allocate", "0x7f0000a00000", 3000, "0x0"),
        ("free", "0x7f0000000000", 1000, "0x0"),
        ("free", "0x7f0000a00000", 3000, "0x0"),
    ]
    path = write("absurd.csv", trace_text(rows))
    for args in ((), ("--capacity", "1GiB"), ("--check", "1")):
        objs, _ = replay_json(path, *args, confs=(PT, PT_EXP))
        for o in objs:
            check_eq(o["events"], 12, "events")
            check_eq(o["ooms"], 4, "ooms (each absurd allocation fails) %r" % (o,))
            # The two real allocations are served: 1024 + 3072 bytes at the peak.
            check_eq(o["peak_allocated_bytes"], 4096, "peak_allocated_bytes %r" % (o,))
            # Peak live is at least the largest allocation live (saturating, not wrapped).
            check(o["peak_live_bytes"] >= 2 ** 64 - 1,
                  "peak_live_bytes wrapped around: %r" % (o,))
    # The table too.
    rc, out, err = run("--conf", PT, path)
    check_no_crash(rc, out, err)
    check_eq(rc, 0, "exit\n" + describe(rc, out, err))
    check(re.search(r"4 allocations ran out of memory, the first at line 3\b", out),
          "table reports the OOMs\n" + out)


def test_bad_conf():
    path = write("small.csv", trace_text(SMALL))
    for conf, word in (("policy:pytorch,bogus:1", "bogus"), ("policy:nosuch", "nosuch"),
                       ("policy:pytorch,max_split_size_mb:xyz", "xyz")):
        rc, out, err = run("--json", "--conf", PT, "--conf", conf, path)
        check_no_crash(rc, out, err)
        check_eq(rc, 2, "exit for --conf %r\n%s" % (conf, describe(rc, out, err)))
        check(word in err, "message names %r\n%s" % (word, describe(rc, out, err)))
        check_eq(out, "", "nothing is replayed when a --conf is bad")


def test_options():
    rc, out, err = run("--frobnicate")
    check_eq(rc, 2, "unknown option\n" + describe(rc, out, err))
    check("--frobnicate" in err, "message names the option\n" + describe(rc, out, err))
    rc, out, err = run("--conf")
    check_eq(rc, 2, "--conf without a value\n" + describe(rc, out, err))
    rc, out, err = run("--check", "x", "--json")
    check_eq(rc, 2, "--check x\n" + describe(rc, out, err))
    for h in ("--help", "-h"):
        rc, out, err = run(h)
        check_eq(rc, 0, h + "\n" + describe(rc, out, err))
        check("usage" in out and "--conf" in out and "--capacity" in out,
              "help text\n" + describe(rc, out, err))


def test_lag():
    # --lag N: the GPU runs N events behind the host. Stream 7 frees 64 MiB (event 2); stream
    # 0's next request (event 3) closes stream 7's epoch, recording an event on it; stream 0's
    # 64 MiB request (event 5) takes stream 7's memory if that event has completed: by then
    # with a lag of 0 or 1 events, not with 2 - without stream waits, it grows instead.
    rows = [("allocate", "0x10000000", 64 * MiB, "0x7"), ("free", "0x10000000", 64 * MiB, "0x7"),
            ("allocate", "0x30000000", 4096, "0x0"), ("free", "0x30000000", 4096, "0x0"),
            ("allocate", "0x20000000", 64 * MiB, "0x0"), ("free", "0x20000000", 64 * MiB, "0x0")]
    path = write("lag.csv", trace_text(rows))
    confs = ("policy:stash,stream_waits:False", PT)
    for lag, want in ((0, 64 * MiB + 2 * MiB), (1, 64 * MiB + 2 * MiB), (2, 130 * MiB),
                      (10, 130 * MiB), (100000000, 130 * MiB)):  # (the longest: nothing done)
        objs, _ = replay_json(path, "--lag", lag, "--check", 1, confs=confs)
        check_eq(objs[0]["lag_events"], lag, "lag_events")
        check_eq(objs[0]["peak_reserved_bytes"], want, "policy:stash with a lag of %d" % lag)
        check_eq(objs[1]["peak_reserved_bytes"], 130 * MiB, "policy:pytorch: its own stream's")
    # policy:pytorch records no event without record_stream: gpt2_sidestream_train is the
    # same under any lag. policy:stash's side stream finds less of the main stream's memory
    # done, and queries more; the check (every event: memory one stream freed reaches another
    # only once that stream's work on it is over, or with a wait) holds.
    t = os.path.join(DATA, "traces", "gpt2_sidestream_train.csv.gz")
    now, _ = replay_json(t, confs=("policy:stash", PT))
    late, _ = replay_json(t, "--lag", 1000, "--check", 1, confs=("policy:stash", PT))
    check_eq(now[0]["lag_events"], 0, "no lag unless asked")
    check_eq(late[1]["peak_reserved_bytes"], now[1]["peak_reserved_bytes"], "policy:pytorch")
    check_eq(late[1]["calls"], now[1]["calls"], "policy:pytorch's calls")
    check(late[0]["peak_reserved_bytes"] >= now[0]["peak_reserved_bytes"] and
          late[0]["calls"]["event_query"][0] > now[0]["calls"]["event_query"][0],
          "policy:stash with a lag: %r, without: %r" % (late[0], now[0]))
    rc, out, err = run("--lag", 2, "--conf", "policy:stash", path)
    check_eq(rc, 0, "--lag 2, the table\n" + describe(rc, out, err))
    check("a GPU 2 events behind" in out, "the table says the lag\n" + describe(rc, out, err))
    rc, out, err = run("--conf", "policy:stash", path)
    check("behind" not in out, "no lag, none said\n" + describe(rc, out, err))
    page = os.path.join(TMP, "lag.html")
    rc, out, err = run("--lag", 2, "--conf", "policy:stash", "--html", page, path)
    check_eq(rc, 0, "--lag 2 --html\n" + describe(rc, out, err))
    with open(page) as f:
        check("a GPU 2 events behind the host" in f.read(), "the page says the lag")
    rc, out, err = run("--lag", "x", path)
    check_eq(rc, 2, "--lag x\n" + describe(rc, out, err))
    check("--lag" in err, "the message names the option\n" + describe(rc, out, err))
    rc, out, err = run("--lag", 5, "--provider", "cuda", path)
    check_eq(rc, 2, "--lag on a GPU\n" + describe(rc, out, err))
    check("simulated" in err, "the message says why\n" + describe(rc, out, err))


def read_trace_py(path):
    """The reference reader: (events, peak_live, nstreams) of an RMM CSV trace."""
    with gzip.open(path, "rt", newline="") as f:
        r = csv.DictReader(f)
        live, streams = {}, set()
        cur = peak = events = 0
        for row in r:
            a, p, s = row["Action"], int(row["Pointer"], 16), int(row["Size"])
            streams.add(int(row["Stream"], 16))
            if a == "allocate":
                live[p] = s
                cur += s
                peak = max(peak, cur)
                events += 1
            elif a == "free" and p in live:
                cur -= live.pop(p)
                events += 1
    return events, peak, len(streams)


def test_real_traces_json():
    traces = sorted(os.path.join(DATA, "traces", n) for n in os.listdir(os.path.join(DATA, "traces"))
                    if n.endswith(".csv.gz"))
    check(traces, "no traces in " + DATA)
    for t in traces:
        events, peak, nstreams = read_trace_py(t)
        objs, _ = replay_json(t, confs=(PT, PT_EXP))
        for o in objs:
            check_eq(o["trace"], os.path.basename(t), "trace")
            check_eq(o["events"], events, "%s: events" % t)
            check_eq(o["peak_live_bytes"], peak, "%s: peak_live_bytes" % t)
            if "streams" in o:
                check_eq(o["streams"], nstreams, "%s: streams" % t)
            check_eq(o["ooms"], 0, "%s: ooms" % t)
            check(o["peak_live_bytes"] <= o["peak_allocated_bytes"] <= o["peak_reserved_bytes"],
                  "%s: live <= allocated <= reserved: %r" % (t, o))


def test_empty_cache_between_steps():
    # The shared fixed-shape traces are 8 training steps each (data/traces/README.md): one
    # empty_cache between each two, and one after the last; memory is given back each time.
    for name in ("resnet50_train.csv.gz", "gpt2_train.csv.gz"):
        t = os.path.join(DATA, "traces", name)
        plain, _ = replay_json(t, confs=("policy:stash", PT))
        emptied, _ = replay_json(t, "--empty-cache-between-steps", confs=("policy:stash", PT))
        for p, e in zip(plain, emptied):
            check_eq(p["empty_caches"], 0, "%s %s: no empty_cache unless asked" % (name, p["conf"]))
            check_eq(e["empty_caches"], 8, "%s %s: one empty_cache per step" % (name, e["conf"]))
            check_eq(e["peak_live_bytes"], p["peak_live_bytes"], "%s: the same trace" % name)
            check(e["device_frees"] > p["device_frees"] and e["device_allocs"] > p["device_allocs"],
                  "%s %s: memory given back and taken again: %r %r" % (name, e["conf"], p, e))


def test_default_run():
    rc, out, err = run()
    check_no_crash(rc, out, err)
    check_eq(rc, 0, "exit of stash-replay with no arguments\n" + describe(rc, out, err))
    check("resnet50_train.csv.gz" in out, "default trace is named\n" + out)
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^([ *]) (\S+)\s+(\d+)\s", line)
        if m:
            rows[m.group(2)] = m
    for c in ("policy:stash", PT, PT_EXP, PT + ",max_split_size_mb:200",
              PT + ",roundup_power2_divisions:4"):
        check(c in rows, "table has a row for %r\n%s" % (c, out))
    check_eq(len(rows), 5, "rows of the default table\n" + out)
    check_eq(sum(m.group(1) == "*" for m in rows.values()), 1, "rows marked '*'\n" + out)
    # Same numbers as replaying the data dir's copy explicitly.
    objs, _ = replay_json(os.path.join(DATA, "traces", "resnet50_train.csv.gz"),
                          confs=("policy:stash", PT, PT_EXP))
    for o in objs:
        check_eq(int(rows[o["conf"]].group(3)), o["peak_reserved_bytes"],
                 "default run's peak reserved for %s" % o["conf"])


# ------------------------------------------------------------------------------------------


def main():
    global BIN, DATA, TMP
    if len(sys.argv) != 3:
        sys.stderr.write("usage: test_replay_cli.py STASH_REPLAY DATA_DIR\n")
        return 2
    BIN, DATA = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
    only = os.environ.get("TEST_ONLY")
    failed = []
    with tempfile.TemporaryDirectory(prefix="stash-replay-cli-") as tmp:
        TMP = tmp
        for name, f in tests:
            if only and only not in name:
                continue
            try:
                f()
                print("PASS %s" % name)
            except Failure as e:
                failed.append(name)
                print("FAIL %s: %s" % (name, e))
            except Exception:
                failed.append(name)
                print("FAIL %s: exception\n%s" % (name, traceback.format_exc()))
            sys.stdout.flush()
    print("%d/%d passed" % (len(tests) - len(failed), len(tests)) if not only else
          "%d failed" % len(failed))
    if failed:
        print("failed: " + " ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
