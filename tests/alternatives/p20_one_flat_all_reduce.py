"""p20 in another style: the sums first, the division last. Each rank backpropagates its plain sum of squared
errors, then one all-reduce carries a flat buffer of every gradient, the rank's count of real rows and its sum of
errors; every rank divides by the count that comes back. One collective per step, on every rank."""

import torch

from puzzles.model import forward

MICRO = 4


def train_step(dist, x, target, valid, layers, lr):
    rows, targets = x[valid], target[valid]
    weights = [w for pair in layers for w in pair]
    errors = torch.zeros((), dtype=torch.float64)
    for start in range(0, rows.shape[0], MICRO):
        err = ((forward(rows[start:start + MICRO], layers) - targets[start:start + MICRO]) ** 2).sum()
        err.backward()
        errors += err.detach()
    grads = [w.grad if w.grad is not None else torch.zeros_like(w) for w in weights]
    flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([float(rows.shape[0])], dtype=torch.float64),
                                                       errors.reshape(1)])
    dist.all_reduce(flat)
    n, loss = flat[-2], flat[-1] / flat[-2]
    with torch.no_grad():
        offset = 0
        for w in weights:
            w -= lr * flat[offset:offset + w.numel()].view_as(w) / n
            offset += w.numel()
    return loss
