"""The poisoned sample's loss masked out (torch.where on the loss of each row) but the row kept in the forward:
the gradient x^T·dy is nan·0 = nan in every weight, and the loss scaler skips the step."""

import torch

from puzzles.model import forward

MISTAKE = "Masks the poisoned sample's loss but keeps its row in the forward, where nan times a zero gradient is nan."
EXPECTED_FAILURES = {"every step taken", "loss curve", "weights"}
DIAGNOSIS = "masking its loss is not enough"


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    masters = [w for pair in layers for w in pair]
    half = [w.half().requires_grad_() for w in masters]
    scale = init_scale
    for x, target in batches:
        keep = torch.isfinite(x).all(dim=1)
        y = forward(x.half(), list(zip(half[0::2], half[1::2])))
        per_row = torch.where(keep, ((y.float() - target) ** 2).sum(dim=1), 0.0)
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
