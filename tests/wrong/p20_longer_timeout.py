"""p20's program as handed out, on a group of every rank made with a timeout of an hour: the ranks still part, so
the run still fails at the timeout the simulator sees for what it is. A longer timeout only waits longer."""

import datetime

import torch

from puzzles.model import forward, loss_fn

MISTAKE = 'Raises the collective timeout instead of fixing why the ranks part.'
EXPECTED_STATUS = "error"
DIAGNOSIS = 'flight recorder analysis'

MICRO = 4


def train_step(dist, x, target, valid, layers, lr):
    group = dist.new_group(list(range(dist.get_world_size())), timeout=datetime.timedelta(hours=1))
    world = dist.get_world_size()
    rows, targets = x[valid], target[valid]
    if rows.shape[0] == 0:
        return None
    weights = [w for pair in layers for w in pair]
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, rows.shape[0], MICRO):
        xm, tm = rows[start:start + MICRO], targets[start:start + MICRO]
        loss = loss_fn(forward(xm, layers), tm) * xm.shape[0] / rows.shape[0]
        grads = torch.autograd.grad(loss, weights)
        for w, g in zip(weights, grads):
            dist.all_reduce(g, group=group)
            g /= world
            w.grad = g if w.grad is None else w.grad + g
        total += loss.detach()
    dist.all_reduce(total, group=group)
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total / world
