#!/usr/bin/env python3
"""Train a model for a few steps under one allocator setting and print one JSON line:
losses, peak reserved bytes, step times. Run once per setting, each in a fresh process.

  train_compare.py --model resnet50|gpt2 --alloc pytorch|stash --conf CONF [--steps 20]
                   [--batch N] [--record SNAPSHOT.pickle] [--empty-cache] [--fraction F]

--fraction: torch.cuda.set_per_process_memory_fraction(F) before the first allocation (the
allocator's reserved memory capped at F of the device: a smaller GPU).

--record (with --alloc pytorch): record every allocation from the first one on
(torch.cuda.memory._record_memory_history) and dump PyTorch's snapshot at the end: a trace
for stash-replay. --batch: another batch size than the shared traces' (128 / 8).

--alloc pytorch: PyTorch's own allocator, CONF (without "policy:pytorch") in
PYTORCH_CUDA_ALLOC_CONF. --alloc stash: stash.torch.install(CONF) before any CUDA memory.
Models as in ../shared/traces/README.md, random weights and data, fixed seeds: ResNet-50
(batch 128, 224x224, bf16 autocast, SGD) and GPT-2 small (12 layers, 768 wide, batch 8 x
1024 tokens, bf16 autocast, AdamW). Deterministic algorithms on; global average pooling and
attention are written out so that every op has a deterministic kernel.

Three more models, for traces policy:stash was not tuned on (tools/gpu/run_record_more_gpu.sh),
all with torch's fused attention (F.scaled_dot_product_attention), bf16 autocast, AdamW:
gpt2sdpa (GPT-2 small, causal, batch 16 x 1024), vit (ViT-B/16, 224x224, batch 128) and bert
(BERT-base encoder, masked-LM head on every position, batch 32 x 512).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True, choices=["resnet50", "gpt2", "gpt2sdpa", "vit", "bert"])
ap.add_argument("--alloc", required=True, choices=["pytorch", "stash"])
ap.add_argument("--conf", default="")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=0)
ap.add_argument("--record", default="")
ap.add_argument("--fraction", type=float, default=0.0,
                help="torch.cuda.set_per_process_memory_fraction(F) before the first allocation")
ap.add_argument("--empty-cache", action="store_true",
                help="torch.cuda.empty_cache() after every step (memory given back and taken again)")
args = ap.parse_args()

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
if args.alloc == "pytorch":
    conf = ",".join(p for p in args.conf.split(",") if p and p != "policy:pytorch")
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if args.alloc == "stash":
    import stash  # noqa: E402
    stash.torch.install(args.conf or None)
if args.fraction:
    torch.cuda.set_per_process_memory_fraction(args.fraction, 0)
elif args.record:
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=4_000_000)

torch.manual_seed(0)
torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
dev = torch.device("cuda", 0)


# ---- ResNet-50 (torchvision's layout) ----------------------------------------------------

class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.c1 = nn.Conv2d(cin, width, 1, bias=False)
        self.b1 = nn.BatchNorm2d(width)
        self.c2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.b2 = nn.BatchNorm2d(width)
        self.c3 = nn.Conv2d(width, cout, 1, bias=False)
        self.b3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class ResNet50(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


# ---- GPT-2 small -------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, ctx=1024, d=768, layers=12, heads=12):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.register_buffer("mask", torch.ones(ctx, ctx, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x, self.mask[:t, :t])
        return self.ln(x) @ self.wte.weight.t()


# ---- fused-attention transformers (gpt2sdpa, vit, bert) -----------------------------------

class FusedBlock(nn.Module):
    def __init__(self, d, heads, causal):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.causal = heads, causal

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Encoder(nn.Module):
    """GPT-2 small (causal, tied output) or BERT-base (bidirectional, tied MLM output)."""
    def __init__(self, vocab, ctx, causal, d=768, layers=12, heads=12):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(FusedBlock(d, heads, causal) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.wte.weight.t()


class ViT(nn.Module):
    def __init__(self, d=768, layers=12, heads=12, patch=16, img=224, classes=1000):
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.ModuleList(FusedBlock(d, heads, False) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x[:, 0]))


# ---- training ----------------------------------------------------------------------------

g = torch.Generator().manual_seed(1)
if args.model == "resnet50":
    model = ResNet50().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    n = args.batch or 128
    batches = [(torch.randn(n, 3, 224, 224, generator=g), torch.randint(0, 1000, (n,), generator=g))
               for _ in range(2)]
    # Pinned, as a DataLoader with pin_memory=True gives them: a copy from pageable memory
    # (77 MB a step here) varies by several ms from run to run and would hide a 2% difference.
    batches = [tuple(x.pin_memory() for x in b) for b in batches]
elif args.model == "gpt2":
    model = GPT2().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    batches = [(torch.randint(0, 50257, (args.batch or 8, 1024), generator=g),) for _ in range(2)]
elif args.model == "vit":
    model = ViT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    n = args.batch or 128
    batches = [tuple(x.pin_memory() for x in (torch.randn(n, 3, 224, 224, generator=g),
                                              torch.randint(0, 1000, (n,), generator=g)))
               for _ in range(2)]
else:  # gpt2sdpa, bert
    causal = args.model == "gpt2sdpa"
    vocab, t = (50257, 1024) if causal else (30522, 512)
    model = Encoder(vocab, t, causal).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    n = args.batch or (16 if causal else 32)
    batches = [(torch.randint(0, vocab, (n, t + causal), generator=g),) for _ in range(2)]

losses, times, gpu_times = [], [], []
ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for step in range(args.steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ev0.record()
    data = [x.to(dev, non_blocking=False) for x in batches[step % 2]]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if args.model in ("resnet50", "vit"):
            loss = F.cross_entropy(model(data[0]), data[1])
        elif args.model == "bert":
            logits = model(data[0])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), data[0].reshape(-1))
        else:
            logits = model(data[0][:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), data[0][:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    ev1.record()
    losses.append(loss.item())  # synchronizes
    times.append(time.perf_counter() - t0)
    gpu_times.append(ev0.elapsed_time(ev1))
    if args.empty_cache:
        del loss
        torch.cuda.empty_cache()

if args.record:
    torch.cuda.memory._dump_snapshot(args.record)
if args.alloc == "stash":
    reserved = stash.max_memory_reserved(0)
    allocated = stash.max_memory_allocated(0)
else:
    reserved = torch.cuda.max_memory_reserved(0)
    allocated = torch.cuda.max_memory_allocated(0)
print(json.dumps({"model": args.model, "alloc": args.alloc, "conf": args.conf, "batch": args.batch or None, "losses": losses,
                  "max_reserved": reserved, "max_allocated": allocated,
                  "median_step_ms": 1000 * statistics.median(times[5:]),
                  "median_gpu_ms": statistics.median(gpu_times[5:]),
                  "step_ms": [round(1000 * t, 3) for t in times]}))
