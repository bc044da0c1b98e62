#!/usr/bin/env python3
"""stash.memory_account() / stash.explain() on a real GPU, through PyTorch's plug-in:
account_check.py CONF. A few training steps of a small MLP with a large output; then, and
after empty_cache(), each pool's terms must add up to its reserved bytes, the pools' reserved
bytes to memory_reserved(), and the live bytes (with what stitched blocks asked for) to
requested_bytes.all.current. Prints the account in words and "RESULT ok" when all held."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402
import stash  # noqa: E402

stash.torch.install(sys.argv[1] if len(sys.argv) > 1 else None)
model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.ReLU(),
                            torch.nn.Linear(8192, 32000)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(4):
    x = torch.randn(512, 4096, device="cuda")
    loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
bad = []
for when in ("after 4 steps", "after empty_cache"):
    acc = stash.memory_account()
    total = 0
    for name, p in acc.items():
        terms = sum(p[k] for k in ("live", "rounding", "pending_free", "lent", "holes", "ends"))
        if terms != p["reserved"]:
            bad.append("%s %s: terms %d != reserved %d" % (when, name, terms, p["reserved"]))
        total += p["reserved"]
    if total != stash.memory_reserved():
        bad.append("%s: pools %d != memory_reserved %d" % (when, total, stash.memory_reserved()))
    live = sum(p["live"] + p["lent_live"] for p in acc.values())
    requested = stash.memory_stats()["requested_bytes.all.current"]
    if live != requested:
        bad.append("%s: live %d != requested_bytes %d" % (when, live, requested))
    print(when + ":\n" + stash.explain())
    torch.cuda.empty_cache()
print("RESULT", "ok" if not bad else "FAIL " + "; ".join(bad))
sys.exit(0 if not bad else 1)
