"""The overflow and the clipping fixed, and the poisoned step's nan gradients zeroed with torch.nan_to_num rather
than the sample dropped: the step changes nothing, and its 31 good samples are lost with the bad one."""

import torch

from puzzles.model import forward

MISTAKE = "Zeroes the non-finite gradients (torch.nan_to_num) instead of dropping the poisoned sample."
EXPECTED_FAILURES = {"every step taken", "loss curve", "weights"}
DIAGNOSIS = "workaround, not a fix"


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    masters = [w for pair in layers for w in pair]
    half = [w.half().requires_grad_() for w in masters]
    scale = init_scale
    for x, target in batches:
        keep = torch.ones(x.shape[0], dtype=torch.bool)
        y = forward(x.half(), list(zip(half[0::2], half[1::2])))
        per_row = ((y.float() - target) ** 2).sum(dim=1)
        stats = torch.stack([per_row.detach().sum(), keep.sum().float()])
        dist.all_reduce(stats)
        (per_row.sum() / stats[1] * scale).backward()
        with torch.no_grad():
            grads = [h.grad.float() / scale for h in half]
            for g in grads:
                dist.all_reduce(g)
            grads = [torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0) for g in grads]  # no more nan
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
        log(torch.nan_to_num(stats[0] / stats[1]))
