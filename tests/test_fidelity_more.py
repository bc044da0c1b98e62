#!/usr/bin/env python3
"""Fidelity on traces recorded after policy:pytorch was written: PyTorch memory snapshots of
8 training steps on an H200 under PyTorch 2.11's own allocator - ResNet-50 (batch 64, 192)
and GPT-2 small (batch 4, 12) in data/traces/more (tools/gpu/run_record_gpu.sh); GPT-2 with
fused attention (batch 16), ViT-B/16 (batch 128) and BERT-base (batch 32) in
data/traces/more2 (tools/gpu/run_record_more_gpu.sh); and eleven RMM logs recorded with the
shared traces' own loop (Hugging Face GPT-2, GPT-2 medium, Llama, OPT, BERT, RoBERTa, T5,
ViT; torchvision ResNet-50 and ResNet-101) in data/traces/hf (tools/gpu/run_record_hf_gpu.sh),
17 more each in data/traces/holdout and data/traces/fresh, 20 in data/traces/later, 28
each in data/traces/final and data/traces/blind, 26 each in data/traces/post and
data/traces/unseen, 24 in data/traces/ninth and 28 each in data/traces/eleventh,
data/traces/twelfth, data/traces/thirteenth and data/traces/fourteenth, 13 in
data/traces/fifteenth, 24 in data/traces/sixteenth and 25 in data/traces/seventeenth, recorded
the same way; and 17 in data/traces/loops (on an H100) and 14 in data/traces/loops2 (on an
H200), the same models under other training loops (tools/gpu/record_loops.py).
Replayed under policy:pytorch, each must give exactly the max_memory_reserved() and
max_memory_allocated() that the training run itself reported (runs.jsonl; its runs under
other settings are not replayed here). The replays use --trace-addresses: each new segment
lies where the training process's driver put it (the address of the allocation that made
it), because PyTorch breaks ties between equally sized free blocks by address and a
training process's cudaMalloc addresses do not follow the fresh-process layout the
simulated device models otherwise (segments land above earlier ones and in holes of the
driver's own layout, presumably left by the process's other device memory). Without it, 34
of the 378 traces tie differently (nineteenth and twentieth sessions): 10 in reserved bytes
(from 54 MiB less than PyTorch, sixteenth/convnext_base_b24, to 104 MiB more,
ninth/wide_resnet101_2_b48), 24 in allocated bytes only.

  test_fidelity_more.py STASH_REPLAY DATA_DIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from compare_policies import SETS  # noqa: E402  (the sets of data/traces, in one place)


def main():
    replay, data = sys.argv[1], sys.argv[2]
    failures = rows = 0
    runs = []
    for sub in ("more", "more2"):
        more = os.path.join(data, "traces", sub)
        runs += [(more, json.loads(line)) for line in open(os.path.join(more, "runs.jsonl"))]
    for sub in [s for s in SETS if s not in ("shared", "more")]:  # hf and the later sets
        d = os.path.join(data, "traces", sub)
        runs += [(d, json.loads(line)) for line in open(os.path.join(d, "runs.jsonl"))]
    for more, run in runs:
        if run.get("conf") or run.get("alloc_conf"):
            continue  # a run under another setting (cudaMallocAsync): an anchor, not a trace
        if "workload" in run:  # data/traces/hf: RMM logs named by workload
            path = os.path.join(more, run["workload"] + ".csv.gz")
        else:
            path = os.path.join(more, "%s_b%d.snapshot.pickle.gz" % (run["model"], run["batch"]))
        p = subprocess.run([replay, "--json", "--trace-addresses", "--conf", "policy:pytorch",
                            path], capture_output=True, text=True)
        if p.returncode != 0:
            print("%s: stash-replay failed (%d): %s" % (path, p.returncode, p.stderr.strip()))
            failures += 1
            continue
        g = json.loads(p.stdout.splitlines()[0])
        rows += 1
        diffs = [(k, g[k], run[w]) for k, w in (("peak_reserved_bytes", "max_reserved"),
                                                 ("peak_allocated_bytes", "max_allocated"))
                 if g[k] != run[w]]
        print("%-34s %s" % (os.path.basename(path), "exact: reserved %d, allocated %d" % (
            g["peak_reserved_bytes"], g["peak_allocated_bytes"]) if not diffs else
            "DIFFERS " + ", ".join("%s %d (PyTorch %d)" % d for d in diffs)))
        failures += bool(diffs)
    print("%d traces, %d differ" % (rows, failures))
    return 1 if failures or rows == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
