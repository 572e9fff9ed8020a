"""p20 made to agree by doing less: every rank runs as many microbatches as the rank with the fewest (a count all-
reduced with MIN); the rows beyond are dropped, and the loss is the mean over the rows kept."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = 'Drops the rows beyond the fewest microbatches of any rank, so that the ranks agree.'
EXPECTED_FAILURES = {"weights after each step", "logged losses"}
DIAGNOSIS = "the step was skipped"

MICRO = 4


def train_step(dist, x, target, valid, layers, lr):
    rows, targets = x[valid], target[valid]
    micro = torch.tensor(float(-(-rows.shape[0] // MICRO)), dtype=torch.float64)
    dist.all_reduce(micro, op=dist.ReduceOp.MIN)  # the fewest microbatches of any rank
    keep = int(micro.item()) * MICRO
    rows, targets = rows[:keep], targets[:keep]
    n = torch.tensor(float(rows.shape[0]), dtype=torch.float64)
    dist.all_reduce(n)
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, rows.shape[0], MICRO):
        loss = ((forward(rows[start:start + MICRO], layers) - targets[start:start + MICRO]) ** 2).sum() / n
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
