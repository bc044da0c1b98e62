#!/usr/bin/env python3
"""Compare two settings of policy:stash over every recorded trace: which traces meet issue 4's
three targets under each, and how far each trace's peak reserved and modelled driver time move.

  tools/compare_policies.py [--sets S,S...] [--knob-build DIR] [--json] A B [C ...]

--json: the report as one JSON object, with each setting's figures per trace ("per_trace":
peak reserved, utilization, bytes over the lowest anchor, modelled driver µs and PyTorch
default's, second-half provider calls, and which targets hold).

A, B, ...: a setting each - "defaults" (the constants compiled in), "NAME=VALUE[,NAME=VALUE]"
(policy:stash's constants, the KNOB_ ones of src/policy_stash.h and src/policy_stash.c, e.g.
kSmallGrowBytes=8388608: replayed by an experiment build, cmake -DSTASH_POLICY_KNOBS=ON, that
the tool makes or brings up to date in --knob-build DIR, default build-knobs), or the path of a
stash-replay binary (another commit's build).
Every setting after A is compared with A.
--arm PHASE: the NAME=VALUE settings act in one phase of each run only, the compiled-in values
elsewhere: first-pass (until live bytes first fall to half their peak, and again once all is
freed), drop (from that first fall on) or step (from the first training step's end, as
src/fate.c finds it) - which decisions a setting
changes, and so what a policy choosing its setting at that point could gain at most.

Sets (data/traces/...): shared (the four shared traces), more (the seven PyTorch snapshots of
data/traces/more and more2), hf, holdout, fresh, later, final, blind, post, unseen, ninth,
eleventh, twelfth, thirteenth, fourteenth, fifteenth, sixteenth, seventeenth, loops and loops2
(the same models under other training loops); default: all; "recorded": all but shared, more,
hf, loops and loops2 (the README's traces recorded with the shared traces' loop to check the
rules).
Anchors, as tools/targets_table.py takes them: PyTorch's four settings replayed by
policy:pytorch (which reproduces the recorded runs) and cudaMallocAsync's recorded peak.
--families also prints, per setting, the README's table by family (VGG, Llama, ViT, GPT-2, OPT,
BERT / RoBERTa, T5-base, T5-small by file name; every other trace a torchvision CNN or Swin).

Why: a change of the policy that lowers peak reserved on most traces and raises it on few is
systematic; one that moves as many traces up as down only reshuffles which traces happen to
pass (docs/policy-stash.md, "Eighth session"). The report says which, with the counts.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from targets_table import CONFS as TABLE_CONFS, async_peaks as read_async_peaks, targets_met

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DATA = os.path.join(ROOT, "data", "traces")
SETS = ["shared", "more", "hf", "holdout", "fresh", "later", "final", "blind", "post", "unseen",
        "ninth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
        "seventeenth", "loops", "loops2"]
SHARED = ["resnet50_train", "gpt2_train", "bert_varlen_train", "gpt2_sidestream_train"]
ANCHOR_CONFS = TABLE_CONFS[1:]  # PyTorch's four settings, the default first


def traces(sets):
    out = []
    for s in sets:
        if s == "shared":
            out += [(os.path.join(DATA, n + ".csv.gz"), s) for n in SHARED]
        elif s == "more":
            out += [(p, s) for p in sorted(glob.glob(os.path.join(DATA, "more*", "*.pickle.gz")))]
        else:
            out += [(p, s) for p in sorted(glob.glob(os.path.join(DATA, s, "*.csv.gz")))]
    return out


def async_peaks():
    """cudaMallocAsync's peak reserved per trace path, where it was recorded."""
    peaks = {}
    dirs = [DATA] + [os.path.dirname(p) for p in glob.glob(os.path.join(DATA, "*", "async.jsonl"))]
    for d in dirs:
        for name, peak in read_async_peaks(d).items():
            peaks[os.path.join(d, name + ".csv.gz")] = peak
    for path in glob.glob(os.path.join(DATA, "more*", "runs.jsonl")):
        for line in open(path):
            d = json.loads(line)
            if "cudaMallocAsync" in (d.get("conf") or ""):
                name = "%s_b%d.snapshot.pickle.gz" % (d["model"], d["batch"])
                peaks[os.path.join(os.path.dirname(path), name)] = d["max_reserved"]
    return peaks


def replay(exe, confs, path, env=None):
    args = [exe, "--json"] + sum([["--conf", c] for c in confs], []) + [path]
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("%s failed on %s: %s" % (exe, path, p.stderr.strip()))
    return [json.loads(line) for line in p.stdout.splitlines()]


def anchors(exe, paths, jobs):
    """Per trace: the lowest anchor's peak reserved and PyTorch default's driver µs."""
    peaks = async_peaks()

    def one(path):
        rows = replay(exe, ANCHOR_CONFS, path)
        low = min([r["peak_reserved_bytes"] for r in rows] +
                  ([peaks[path]] if path in peaks else []))
        return path, {"min": low, "driver_us": rows[0]["modeled_driver_us"]}
    with ThreadPoolExecutor(jobs) as ex:
        return dict(ex.map(one, paths))


def knob_build(dir_):
    """The experiment build's stash-replay, configured once and brought up to date each time
    (a build of older sources would answer for other rules)."""
    if not os.path.exists(os.path.join(dir_, "CMakeCache.txt")):
        subprocess.run(["cmake", "-S", ROOT, "-B", dir_, "-DSTASH_POLICY_KNOBS=ON",
                        "-DSTASH_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", dir_, "--target", "stash-replay", "-j",
                    str(os.cpu_count() or 2)], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(dir_, "stash-replay")


def side(spec, default_exe, knob_dir, arm=None):
    """(stash-replay binary, environment) for a setting."""
    if spec == "defaults":
        return default_exe, None
    if os.path.isfile(spec):
        return spec, None
    env = dict(os.environ)
    for item in spec.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.startswith("k") or not value:
            sys.exit("compare_policies: bad setting %r: want defaults, NAME=VALUE[,...] or a "
                     "stash-replay path" % spec)
        if int(value, 0) <= 0:  # (a bad number stops in int(), with Python's message)
            sys.exit("compare_policies: %s=%s: the constants are positive integers" % (
                name, value))
        env["STASH_KNOB_" + name] = value
    if arm:
        env["STASH_KNOB_ARM"] = arm
    return knob_build(knob_dir), env


def measure(exe, env, paths, anchor, jobs):
    def one(item):
        path, set_ = item
        r = replay(exe, ["policy:stash"], path, env)[0]
        a = anchor[path]
        memory, driver, steady = targets_met(os.path.basename(path), r, a["min"], a["driver_us"])
        return path, {"set": set_, "peak": r["peak_reserved_bytes"],
                      "driver_us": r["modeled_driver_us"], "all_three": memory and driver and steady,
                      "memory": memory, "driver": driver, "steady": steady,
                      "utilization": r["utilization"],
                      "over_anchor": r["peak_reserved_bytes"] - a["min"],
                      "pytorch_driver_us": a["driver_us"],
                      "second_half_calls": r["device_allocs_second_half"] +
                      r["device_frees_second_half"]}
    with ThreadPoolExecutor(jobs) as ex:
        return dict(ex.map(one, paths))


def compare(base, other):
    d = [other[p]["peak"] - base[p]["peak"] for p in base]
    r = [other[p]["driver_us"] / base[p]["driver_us"] for p in base if base[p]["driver_us"] > 0]
    flips = [{"trace": os.path.relpath(p, DATA), "now": other[p]["all_three"]}
             for p in base if base[p]["all_three"] != other[p]["all_three"]]
    return {"peak_lower": sum(x < 0 for x in d), "peak_same": sum(x == 0 for x in d),
            "peak_higher": sum(x > 0 for x in d), "peak_delta_median": statistics.median(d),
            "peak_delta_min": min(d), "peak_delta_max": max(d),
            "driver_ratio_median": statistics.median(r) if r else None,
            "driver_ratio_max": max(r) if r else None, "flips": flips}


FAMILIES = [("VGG", ("vgg",)), ("Llama", ("llama",)), ("ViT", ("vit",)), ("GPT-2", ("gpt2",)),
            ("OPT", ("opt",)), ("BERT / RoBERTa", ("bert", "roberta")), ("T5-base", ("t5_base",)),
            ("T5-small", ("t5",)), ("torchvision CNNs and Swin", ("",))]
FAMILY_ORDER = ["torchvision CNNs and Swin", "ViT", "GPT-2", "OPT", "BERT / RoBERTa", "T5-small",
                "T5-base", "Llama", "VGG"]


def family(name):
    """The README's family of a trace, by its file name (the first prefix that matches)."""
    return next(f for f, prefixes in FAMILIES if name.startswith(prefixes))


def family_table(per_trace):
    """The README's table "by family": per family, how many traces meet all three targets, and
    where the others fail (a trace can fail more than one target)."""
    def span(xs, fmt):  # one figure when the extremes print alike ("by 10%", not "10-10%")
        lo, hi = fmt % min(xs), fmt % max(xs)
        return lo if lo == hi else lo + "-" + hi
    rows = ["| family | all three targets | where the others fail |", "|---|---:|---|"]
    total = [0, 0]
    for fam in FAMILY_ORDER:
        vs = [v for p, v in per_trace.items() if family(os.path.basename(p)) == fam]
        if not vs:
            continue
        ok = sum(v["all_three"] for v in vs)
        total[0] += ok
        total[1] += len(vs)
        under = [100 * v["utilization"] for v in vs if v["utilization"] < 0.98]
        over = [v["over_anchor"] / 1e6 for v in vs if v["over_anchor"] > 0]
        slow = [100 * (v["driver_us"] / v["pytorch_driver_us"] - 1) for v in vs if not v["driver"]]
        late = sum(not v["steady"] for v in vs)
        why = []
        if under:
            why.append("%d under 98%% (%s%%)" % (len(under), span(under, "%.2f")))
        if over:
            why.append("%d over an anchor (by %s MB)" % (len(over), span(over, "%.1f")))
        if slow:
            why.append("%d over PyTorch's driver time (by %s%%)" % (len(slow), span(slow, "%.0f")))
        if late:
            why.append("%d with calls in the second half" % late)
        rows.append("| %s | %d of %d | %s |" % (fam, ok, len(vs), "; ".join(why)))
    rows.append("| **all** | **%d of %d** | |" % tuple(total))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs="+")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--replay", default=os.path.join(ROOT, "build", "stash-replay"),
                    help="the stash-replay of 'defaults', and for the anchors")
    ap.add_argument("--knob-build", default=os.path.join(ROOT, "build-knobs"))
    ap.add_argument("--arm", choices=["first-pass", "drop", "step"],
                    help="the NAME=VALUE settings act in this phase of each run only")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--families", action="store_true",
                    help="also print, per setting, the README's table by family")
    args = ap.parse_args()
    if len(args.settings) < 2:
        ap.error("give at least two settings: A B [C ...]")
    if args.sets == "recorded":  # the README's "traces recorded to check the rules"
        args.sets = ",".join(s for s in SETS if s not in ("shared", "more", "hf", "loops", "loops2"))
    sets = args.sets.split(",")
    bad = [s for s in sets if s not in SETS]
    if bad:
        ap.error("unknown set(s) %s: choose from %s" % (", ".join(bad), ", ".join(SETS)))
    items = traces(sets)
    anchor = anchors(args.replay, [p for p, _ in items], args.jobs)
    results = [measure(*side(s, args.replay, args.knob_build, args.arm), items, anchor, args.jobs)
               for s in args.settings]
    report = []
    for spec, res in zip(args.settings, results):
        per_set = {s: [sum(1 for v in res.values() if v["set"] == s and v["all_three"]),
                       sum(1 for v in res.values() if v["set"] == s)] for s in sets}
        entry = {"setting": spec, "all_three": sum(v["all_three"] for v in res.values()),
                 "memory": sum(v["memory"] for v in res.values()), "traces": len(res),
                 "per_set": per_set,
                 "peaks": {os.path.relpath(p, DATA): v["peak"] for p, v in res.items()},
                 "per_trace": {os.path.relpath(p, DATA): {k: x for k, x in v.items() if k != "set"}
                               for p, v in res.items()},
                 "passing": sorted(os.path.relpath(p, DATA) for p, v in res.items()
                                   if v["all_three"])}
        if res is not results[0]:
            entry["against_first"] = compare(results[0], res)
        if args.families:
            entry["families"] = family_table(res)
        report.append(entry)
    union = sorted(set().union(*[e["passing"] for e in report]))
    if args.json:
        print(json.dumps({"settings": report, "passing_under_any": union, "arm": args.arm},
                         indent=1))
        return
    if args.arm:
        print("the settings act in one phase of each run: %s" % args.arm)
    for e in report:
        print("%s: all three targets on %d of %d traces (memory on %d); per set %s" % (
            e["setting"], e["all_three"], e["traces"], e["memory"],
            ", ".join("%s %d/%d" % (s, *n) for s, n in e["per_set"].items())))
        c = e.get("against_first")
        if c:
            print("  against %s: peak reserved lower on %d, the same on %d, higher on %d "
                  "(median %+.1f MB, %+.1f to %+.1f); driver time x%.3f median, x%.3f at most" % (
                      report[0]["setting"], c["peak_lower"], c["peak_same"], c["peak_higher"],
                      c["peak_delta_median"] / 1e6, c["peak_delta_min"] / 1e6,
                      c["peak_delta_max"] / 1e6, c["driver_ratio_median"], c["driver_ratio_max"]))
            for f in c["flips"]:
                print("    %s %s" % ("gains" if f["now"] else "loses", f["trace"]))
        if args.families:
            print("\n%s\n" % e["families"])
    if len(report) > 2:
        print("all three targets under at least one of the %d settings: %d of %d traces" % (
            len(report), len(union), report[0]["traces"]))


if __name__ == "__main__":
    main()
