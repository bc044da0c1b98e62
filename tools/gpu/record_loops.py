"""Record training traces whose loop is not the shared traces' own.

Every CSV set recorded so far (tools/gpu/record_hf.py) runs one loop: forward under bf16
autocast, backward, optimizer step (foreach AdamW, or SGD with momentum), zero_grad
(set_to_none=True). policy:stash's rules were chosen on those traces, and on the one other
loop it was measured on (data/traces/more*: train_compare.py, which frees the gradients after
the next forward pass) the targets hold on 2 of 7. This script records the same models under
loops that programs commonly run instead, one change each, so that policy:stash is measured
on loop shapes it was not tuned on (data/traces/loops, recorded on an H100 in the
thirty-fourth session):

  accum2      gradient accumulation: two forward/backward passes per optimizer step
  keepgrads   zero_grad(set_to_none=False): the gradients live through the next forward pass
  fused       AdamW(fused=True): one kernel, no foreach temporaries
  nonforeach  the optimizer's per-parameter loop (foreach=False)
  scaler      float16 autocast with a GradScaler (unscale, inf checks, skipped steps)
  fp32        no autocast: float32 activations
  ckpt        activation checkpointing (Hugging Face gradient_checkpointing_enable)
  evalmix     every third step is preceded by an evaluation forward pass under no_grad
  prefetch    the next batch is made before this step's backward pass
  bf16params  the model itself in bfloat16 (parameters, gradients and optimizer state)

A second batch, written in the same session after the first had been replayed, was recorded
in the thirty-fifth (data/traces/loops2, on an H200; no rule changed in between):

  clip        gradient clipping (clip_grad_norm_ to 1.0) before each step
  ema         an exponential moving average of the parameters, updated after each step
  frozen      only the last quarter of the parameters trained (fine-tuning): the rest
              get no gradients and no optimizer state
  infer       inference only: model.eval() and forward passes under no_grad, no optimizer
  varlen      causal LMs: a sequence length drawn from [128, 1024] for each step
  chlast      torchvision models and their batches in channels_last memory format
  lastbatch   the last step's batch half the size (a data loader without drop_last)
  sgd         plain SGD (no momentum: no optimizer state) for a transformer

  python3 tools/gpu/record_loops.py WORKLOAD OUTDIR      (on the device machine)

Writes what record_hf.py writes (OUTDIR/WORKLOAD.csv.gz, OUTDIR/WORKLOAD.json), with the
same models (random weights and data, fixed seeds); run through
`RECORDER=tools/gpu/record_loops.py bash tools/gpu/run_record_hf_gpu.sh`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_hf as R  # noqa: E402  (the models, the recording, PyTorch's figures)
import torch  # noqa: E402

VARIANT = ""
_AdamW, _SGD = torch.optim.AdamW, torch.optim.SGD


def _opt_kwargs():
    return {"nonforeach": {"foreach": False}, "fused": {"fused": True}}.get(VARIANT, {})


def _trainable(params):
    """frozen: only the last quarter of the parameters take gradients and optimizer state."""
    params = list(params)
    if VARIANT == "frozen":
        for p in params[:len(params) * 3 // 4]:
            p.requires_grad_(False)
        params = params[len(params) * 3 // 4:]
    return params


def _adamw(params, **kw):
    if VARIANT == "sgd":
        return _SGD(params, lr=1e-4)
    return _AdamW(_trainable(params), **kw, **_opt_kwargs())


def _sgd(params, **kw):
    return _SGD(params, **kw, **_opt_kwargs())


torch.optim.AdamW, torch.optim.SGD = _adamw, _sgd  # the models' builders make their optimizer


def loop(model, opt, batches, forward, steps):
    """record_hf.py's loop with one change, VARIANT."""
    v = VARIANT
    scaler = torch.amp.GradScaler("cuda") if v == "scaler" else None
    dtype = torch.float16 if v == "scaler" else torch.bfloat16
    if v == "ckpt":
        model.train()
        model.gradient_checkpointing_enable()
    if v == "bf16params":
        model.to(torch.bfloat16)
    micro = 2 if v == "accum2" else 1
    nxt = batches(0) if v == "prefetch" else None
    ema = [p.detach().clone() for p in model.parameters()] if v == "ema" else None
    if v == "infer":
        model.eval()
        for i in range(steps):
            with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
                forward(model, batches(i))
            yield
        return
    for i in range(steps):
        if v == "evalmix" and i % 3 == 2:
            model.eval()
            with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
                forward(model, batches(1000 + i))
            model.train()
        for k in range(micro):
            b = nxt if v == "prefetch" else batches(i * micro + k)
            with torch.autocast("cuda", dtype=dtype, enabled=v != "fp32"):
                loss = forward(model, b) / micro
            if v == "prefetch":
                nxt = batches(i + 1)
            (scaler.scale(loss) if scaler else loss).backward()
            del b
        if v == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=v != "keepgrads")
        if ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in model.parameters()], 0.001)
        yield


def _hf_train(model, opt, batches, steps=R.STEPS):
    return loop(model, opt, batches, lambda m, kw: m(**kw).loss, steps)


def vision(name, bs):  # record_hf.py's torchvision classifier, its batch made by `batches`
    import torchvision
    m = getattr(torchvision.models, name)(weights=None).to(R.dev)
    fmt = torch.channels_last if VARIANT == "chlast" else torch.contiguous_format
    m = m.to(memory_format=fmt)
    opt = torch.optim.SGD(_trainable(m.parameters()), lr=0.1, momentum=0.9)

    def batch(i):
        n = bs // 2 if VARIANT == "lastbatch" and i == R.STEPS - 1 else bs
        return (torch.randn(n, 3, 224, 224, device=R.dev).to(memory_format=fmt),
                torch.randint(0, 1000, (n,), device=R.dev))
    return loop(m, opt, batch, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                R.STEPS)


R.train = _hf_train  # the Hugging Face builders call record_hf's train()


def _varlen_tokens(vocab, bs, seq, labels=True):
    """varlen: record_hf.tokens with a sequence length drawn for each step (fixed seed)."""
    g = torch.Generator().manual_seed(3)

    def make(_):
        n = int(torch.randint(128, seq + 1, (1,), generator=g)) if VARIANT == "varlen" else seq
        ids = torch.randint(0, vocab, (bs, n), device=R.dev)
        return {"input_ids": ids, "labels": ids} if labels else {"input_ids": ids}
    return make


R.tokens = _varlen_tokens

# data/traces/loops: chosen before any was replayed; model sizes recorded before, loops not.
LOOPS = {
    "gpt2_b8_accum2": ("accum2", lambda: R.gpt2(8)),
    "llama_b6_accum2": ("accum2", lambda: R.llama(6)),
    "efficientnet_b0_b128_accum2": ("accum2", lambda: vision("efficientnet_b0", 128)),
    "bert_b16_keepgrads": ("keepgrads", lambda: R.bert_mlm(16, 512)),
    "resnet101_b64_keepgrads": ("keepgrads", lambda: vision("resnet101", 64)),
    "vit_b64_fused": ("fused", lambda: R.vit(64)),
    "bert_large_b4_fused": ("fused", lambda: R.bert_large(4)),
    "t5_b32_nonforeach": ("nonforeach", lambda: R.t5(32, 512, 128)),
    "swin_t_b64_nonforeach": ("nonforeach", lambda: vision("swin_t", 64)),
    "resnet50_b96_scaler": ("scaler", lambda: vision("resnet50", 96)),
    "llama_b4_scaler": ("scaler", lambda: R.llama(4)),
    "convnext_tiny_b64_fp32": ("fp32", lambda: vision("convnext_tiny", 64)),
    "gpt2_b8_ckpt": ("ckpt", lambda: R.gpt2(8)),
    "opt125m_b8_evalmix": ("evalmix", lambda: R.opt125m(8)),
    "resnet50_b64_evalmix": ("evalmix", lambda: vision("resnet50", 64)),
    "roberta_b16_prefetch": ("prefetch", lambda: R.roberta(16, 512)),
    "gpt2_medium_b4_bf16params": ("bf16params", lambda: R.gpt2_medium(4)),
    # data/traces/loops2: a second batch, written after the first was replayed (no rule
    # changed in between), recorded with WORKLOADS="gpt2_b8_clip ... opt125m_b8_sgd"
    "gpt2_b8_clip": ("clip", lambda: R.gpt2(8)),
    "roberta_b16_clip": ("clip", lambda: R.roberta(16, 512)),
    "vit_b64_ema": ("ema", lambda: R.vit(64)),
    "swin_t_b64_ema": ("ema", lambda: vision("swin_t", 64)),
    "bert_b16_frozen": ("frozen", lambda: R.bert_mlm(16, 512)),
    "llama_b8_frozen": ("frozen", lambda: R.llama(8)),
    "gpt2_b8_infer": ("infer", lambda: R.gpt2(8)),
    "resnet50_b128_infer": ("infer", lambda: vision("resnet50", 128)),
    "gpt2_b8_varlen": ("varlen", lambda: R.gpt2(8)),
    "opt125m_b8_varlen": ("varlen", lambda: R.opt125m(8)),
    "resnet50_b64_chlast": ("chlast", lambda: vision("resnet50", 64)),
    "convnext_tiny_b64_chlast": ("chlast", lambda: vision("convnext_tiny", 64)),
    "resnet101_b64_lastbatch": ("lastbatch", lambda: vision("resnet101", 64)),
    "opt125m_b8_sgd": ("sgd", lambda: R.opt125m(8)),
}


def _workload(variant, build):
    def start():
        global VARIANT
        VARIANT = variant
        return build()
    return start


R.WORKLOADS = {name: _workload(*vb) for name, vb in LOOPS.items()}
R.__doc__ = __doc__

if __name__ == "__main__":
    sys.exit(R.main())
