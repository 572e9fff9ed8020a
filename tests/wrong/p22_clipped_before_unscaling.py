"""The overflow and the poisoned sample fixed, the clipping left before the unscaling: every step is clipped as
if its gradient were 256 times larger, and the loss falls far more slowly than the float32 run's."""

import torch

from puzzles.model import forward

MISTAKE = "Clips the gradients while they are still multiplied by the loss scale."
EXPECTED_FAILURES = {"loss curve", "weights"}
DIAGNOSIS = "clipped while still multiplied by the loss scale"


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    masters = [w for pair in layers for w in pair]
    half = [w.half().requires_grad_() for w in masters]
    scale = init_scale
    for x, target in batches:
        keep = torch.isfinite(x).all(dim=1)
        y = forward(x[keep].half(), list(zip(half[0::2], half[1::2])))
        per_row = ((y.float() - target[keep]) ** 2).sum(dim=1)
        stats = torch.stack([per_row.detach().sum(), keep.sum().float()])
        dist.all_reduce(stats)
        (per_row.sum() / stats[1] * scale).backward()
        with torch.no_grad():
            grads = [h.grad.float() for h in half]
            for g in grads:
                dist.all_reduce(g)
            norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # clipped while still scaled
            grads = [g * coef / scale for g in grads]
            coef = 1.0
            if not all(torch.isfinite(g).all() for g in grads):
                scale /= 2
            else:
                for w, g, h in zip(masters, grads, half):
                    w -= lr * coef * g
                    h.copy_(w)
            for h in half:
                h.grad = None
        log(stats[0] / stats[1])
