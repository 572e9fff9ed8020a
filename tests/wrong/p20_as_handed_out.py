"""p20 as handed out: the data-dependent skip (a rank with no real row returns before any collective) and the
rank-dependent loop count (an all-reduce per microbatch, and microbatches per rank from its own rows)."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = 'The program as handed out: ranks skip steps and make different numbers of all-reduces; the run hangs.'
EXPECTED_STATUS = "error"
DIAGNOSIS = 'flight recorder analysis'

MICRO = 4


def train_step(dist, x, target, valid, layers, lr):
    world = dist.get_world_size()
    rows, targets = x[valid], target[valid]  # this rank's real rows (the padding left out)
    if rows.shape[0] == 0:
        return None  # nothing to learn from on this rank
    weights = [w for pair in layers for w in pair]
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, rows.shape[0], MICRO):  # microbatches, to bound the activations' memory
        xm, tm = rows[start:start + MICRO], targets[start:start + MICRO]
        loss = loss_fn(forward(xm, layers), tm) * xm.shape[0] / rows.shape[0]  # this rank's mean, in parts
        grads = torch.autograd.grad(loss, weights)
        for w, g in zip(weights, grads):
            dist.all_reduce(g)  # averaged as each microbatch's backward ends, as DDP does
            g /= world
            w.grad = g if w.grad is None else w.grad + g
        total += loss.detach()
    dist.all_reduce(total)  # the loss, for the log
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total / world
