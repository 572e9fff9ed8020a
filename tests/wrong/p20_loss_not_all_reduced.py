"""p20 fixed, but each rank logs its own share of the loss, never all-reduced."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "Returns the rank's own share of the loss instead of the all-reduced one."
EXPECTED_FAILURES = {"logged losses"}
DIAGNOSIS = 'its own share only'

MICRO = 4


def train_step(dist, x, target, valid, layers, lr):
    rows, targets = x[valid], target[valid]
    n = torch.tensor(float(rows.shape[0]), dtype=torch.float64)
    dist.all_reduce(n)
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, rows.shape[0], MICRO):
        xm, tm = rows[start:start + MICRO], targets[start:start + MICRO]
        loss = ((forward(xm, layers) - tm) ** 2).sum() / n
        loss.backward()
        total += loss.detach()
    weights = [w for pair in layers for w in pair]
    for w in weights:
        if w.grad is None:
            w.grad = torch.zeros_like(w)
        dist.all_reduce(w.grad)
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total
