"""The overflow and the clipping fixed, and every step whose loss is not finite skipped (the update and the
gradients thrown away), so the poisoned sample never reaches the weights: nor do the 31 good samples of its step."""

import torch

from puzzles.model import forward

MISTAKE = "Skips every step whose loss is not finite instead of dropping the poisoned sample."
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
        if not torch.isfinite(stats[0]):  # a bad step: skip it
            log(stats[0] / stats[1])
            continue
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
