"""A fix that remembers where the poisoned sample sat at one seed (at seed 0: step 5, rank 2, row 3) and drops
that row: it passes at seed 0, and at another seed the poison is elsewhere and stays, and a good row goes."""

import torch

from puzzles.model import forward

MISTAKE = ("Drops the row that was poisoned at one seed (step 5, rank 2, row 3 at seed 0) instead of finding the "
           "non-finite sample.")
EXPECTED_FAILURES = {"every step taken", "loss curve", "weights"}
DIAGNOSIS = "one sample of this step holds a NaN"

STEP, RANK, ROW = 5, 2, 3


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    masters = [w for pair in layers for w in pair]
    half = [w.half().requires_grad_() for w in masters]
    scale = init_scale
    for s, (x, target) in enumerate(batches):
        keep = torch.arange(x.shape[0]) != (ROW if (s, dist.get_rank()) == (STEP, RANK) else -1)
        y = forward(x[keep].half(), list(zip(half[0::2], half[1::2])))
        per_row = ((y.float() - target[keep]) ** 2).sum(dim=1)
        stats = torch.stack([per_row.detach().sum(), keep.sum().float()])
        dist.all_reduce(stats)
        (per_row.sum() / stats[1] * scale).backward()
        with torch.no_grad():
            grads = [h.grad.float() / scale for h in half]
            for g in grads:
                dist.all_reduce(g)
            norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            if not all(torch.isfinite(g).all() for g in grads):
                scale /= 2
            else:
                for w, g, h in zip(masters, grads, half):
                    w -= lr * coef * g
                    h.copy_(w)
            for h in half:
                h.grad = None
        log(stats[0] / stats[1])
