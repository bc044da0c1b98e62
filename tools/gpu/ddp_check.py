#!/usr/bin/env python3
"""DDP on several GPUs through stash: torchrun --nproc_per_node=N ddp_check.py [CONF].
Each rank installs stash on its own device, trains a small transformer-like MLP for 6
steps with DistributedDataParallel (NCCL), and checks: the gradients were all-reduced (every
rank holds the same gradient and the same parameters after each step, though each saw its
own data), and each rank's stash statistics are its own (only its device has a heap, and
that heap holds memory). Rank 0 prints one JSON line; any failed check exits non-zero.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import stash  # noqa: E402

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
local = int(os.environ["LOCAL_RANK"])
stash.torch.install(sys.argv[1] if len(sys.argv) > 1 else None)  # before CUDA starts
torch.cuda.set_device(local)
dist.init_process_group("nccl")
dev = torch.device("cuda", local)
torch.manual_seed(0)  # the same initial weights on every rank
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
gen = torch.Generator(device=dev).manual_seed(100 + rank)  # each rank its own data
problems = []
for step in range(6):
    x = torch.randn(256, 1024, device=dev, generator=gen)
    opt.zero_grad()
    with ddp.no_sync():  # this rank's own gradient, not reduced
        ddp(x).square().mean().backward()
    own = torch.cat([p.grad.flatten() for p in model.parameters()])
    expect = own.clone()
    dist.all_reduce(expect)
    expect /= world
    opt.zero_grad()
    loss = ddp(x).square().mean()
    loss.backward()  # DDP all-reduces (averages) the gradients here
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    if not torch.allclose(grad, expect, rtol=1e-5, atol=1e-7):
        problems.append("step %d: DDP's gradient is not the average of the ranks' (max diff %g)"
                        % (step, (grad - expect).abs().max().item()))
    gathered = [torch.empty_like(grad) for _ in range(world)]
    dist.all_gather(gathered, grad)
    if any(not torch.equal(gathered[0], g) for g in gathered):
        problems.append("step %d: gradients differ between ranks" % step)
    if step == 0 and torch.equal(own, expect):
        problems.append("the ranks' own gradients are equal: the check would prove nothing")
    opt.step()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    pg = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(pg, params)
    if any(not torch.equal(pg[0], p) for p in pg):
        problems.append("step %d: parameters differ between ranks" % step)
losses = [torch.zeros(1, device=dev) for _ in range(world)]
dist.all_gather(losses, loss.detach().reshape(1))
torch.cuda.synchronize()
heaps = stash._lib.lib().stash_default_heap_list(None, 0)
mine = stash.memory_stats(local)
if heaps != 1:
    problems.append("rank %d: %d stash heaps (only its device's expected)" % (rank, heaps))
if mine["allocated_bytes.all.current"] <= 0 or mine["allocation.all.allocated"] <= 0:
    problems.append("rank %d: its heap holds nothing" % rank)
stats = {"rank": rank, "device": local, "heaps": heaps,
         "allocated": mine["allocated_bytes.all.current"],
         "max_reserved": mine["reserved_bytes.all.peak"], "allocations": mine["allocation.all.allocated"],
         "problems": problems}
everyone = [None] * world
dist.all_gather_object(everyone, stats)
if rank == 0:
    print(json.dumps({"world": world, "losses_per_rank": [float(l) for l in losses],
                      "ranks": everyone}))
dist.destroy_process_group()
sys.exit(1 if any(s["problems"] for s in everyone) else 0)
