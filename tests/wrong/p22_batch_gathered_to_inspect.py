"""Every rank's inputs all-gathered at every step, so that each rank can look at the whole batch for the poisoned
sample: the values are right, and each step sends the batch's inputs on top of the gradients. The check is local:
each rank tests its own rows, and the count of clean rows is one number."""

import torch

from puzzles.model import forward

MISTAKE = ("Gathers the whole batch to every rank to find the poisoned sample, where a per-row check on the rank "
           "suffices.")
EXPECTED_FAILURES = {"communication"}
DIAGNOSIS = "test its own rows"


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    world, rank = dist.get_world_size(), dist.get_rank()
    masters = [w for pair in layers for w in pair]
    half = [w.half().requires_grad_() for w in masters]
    for x, target in batches:
        everyone = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(everyone, x)  # the whole batch, to inspect it
        clean = torch.isfinite(torch.cat(everyone)).all(dim=1)
        keep = clean[rank * x.shape[0]:(rank + 1) * x.shape[0]]
        y = forward(x[keep].half(), list(zip(half[0::2], half[1::2])))
        per_row = ((y.float() - target[keep]) ** 2).sum(dim=1)
        total = per_row.detach().sum().reshape(1)
        dist.all_reduce(total)
        count = clean.sum().float()
        (per_row.sum() / count * init_scale).backward()
        with torch.no_grad():
            grads = [h.grad.float() / init_scale for h in half]
            for g in grads:
                dist.all_reduce(g)
            norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for w, g, h in zip(masters, grads, half):
                w -= lr * coef * g
                h.copy_(w)
                h.grad = None
        log(total[0] / count)
