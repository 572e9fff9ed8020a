"""p20 with the hang fixed, the loss divided by every row of the batch, padding included."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = 'Divides by every row, padding included, not by the real rows.'
EXPECTED_FAILURES = {"weights after each step", "logged losses"}
DIAGNOSIS = 'padding included'

MICRO = 4


def train_step(dist, x, target, valid, layers, lr):
    rows, targets = x[valid], target[valid]
    n = torch.tensor(float(x.shape[0]), dtype=torch.float64)
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
    dist.all_reduce(total)
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total
