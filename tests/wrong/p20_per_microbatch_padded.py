"""p20 made to agree as torch's Join does: each rank all-reduces the gradient of each microbatch, and the ranks with
fewer microbatches all-reduce zeros until every rank has made as many as the most (a count all-reduced with MAX).
Right values, and a hang no more; but a collective per microbatch sends the gradients up to twice a step."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = 'Keeps an all-reduce per microbatch and pads the ranks with fewer microbatches with empty ones.'
EXPECTED_FAILURES = {"communication"}
DIAGNOSIS = 'a collective per microbatch'

MICRO = 4


def train_step(dist, x, target, valid, layers, lr):
    rows, targets = x[valid], target[valid]
    n = torch.tensor(float(rows.shape[0]), dtype=torch.float64)
    dist.all_reduce(n)
    most = torch.tensor(float(-(-rows.shape[0] // MICRO)), dtype=torch.float64)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    weights = [w for pair in layers for w in pair]
    for w in weights:
        w.grad = torch.zeros_like(w)
    total = torch.zeros((), dtype=torch.float64)
    for m in range(int(most.item())):
        xm, tm = rows[m * MICRO:(m + 1) * MICRO], targets[m * MICRO:(m + 1) * MICRO]
        if xm.shape[0]:
            loss = ((forward(xm, layers) - tm) ** 2).sum() / n
            grads = torch.autograd.grad(loss, weights)
            total += loss.detach()
        else:
            grads = [torch.zeros_like(w) for w in weights]  # an empty microbatch, to keep in step
        for w, g in zip(weights, grads):
            dist.all_reduce(g)
            w.grad += g
    dist.all_reduce(total)
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total
