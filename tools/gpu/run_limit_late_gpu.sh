#!/usr/bin/env bash
# On the device machine (one GPU: the H200 it was written for, or an H100 80GB - run on one in
# the thirty-fifth and thirty-sixth sessions, docs/results/gpu-check-35-tail.md and
# gpu-check-36-limit.md): the twenty-third session's
# rule at the device's limit - a heap that first holds 90% of what it may hold after its first
# drop turns tight there.
# The five traces whose smallest device the rule lowered most (tools/min_capacity.py on the
# simulated H200, +2 MiB), under policy:stash, through tools/gpu/run_limit_gpu.sh: expected
# no out-of-memory error, the same peak reserved bytes on the GPU as simulated, and the
# driver's memory in use equal to reserved at every reading. Results in $OUT/limit-late/.
LIMITS="hf/bert_varlen_seed2:12680 unseen/vgg19_b32:3360 eleventh/llama_b13:14202
        ninth/vgg16_b48:3898 seventeenth/gpt2_large_b4:29210" \
CONFS="policy:stash" NAME=limit-late exec bash "$(dirname "$0")/run_limit_gpu.sh"
