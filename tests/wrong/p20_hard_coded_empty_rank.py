"""A cheat that remembers one seed: at seed 7, run A's empty share is rank 3's, so rank 3 alone is made to take part
with zeros, and any other rank with no real row still skips. Run B's empty rank is another one: it hangs there."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = 'Hard-codes the rank that had no real row at one seed (rank 3 at seed 7) instead of handling any empty rank.'
EXPECTED_STATUS = "error"
DIAGNOSIS = 'flight recorder analysis'

MICRO = 4


def train_step(dist, x, target, valid, layers, lr):
    rows, targets = x[valid], target[valid]
    if rows.shape[0] == 0 and dist.get_rank() != 3:
        return None
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
    dist.all_reduce(total)
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total
