"""p20 with the collectives made once per step, but the rank with no real row hands all_reduce its w.grad, which
backward never filled: None."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = 'The rank with no real row all-reduces w.grad, which is None there (no backward ran).'
EXPECTED_STATUS = "error"
DIAGNOSIS = 'backward never fills its w.grad'

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
        dist.all_reduce(w.grad)
    dist.all_reduce(total)
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total
