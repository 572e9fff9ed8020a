"""Naive p2: puzzle 1's answer on every rank. Right gradients, but each rank keeps the full checkpoints, and gathers
nothing (so the gather checks fail too: nothing gathered is not a pass)."""

import torch

from puzzles.model import block, forward

EXPECTED_FAILURES = {"checkpoint bytes", "gathered checkpoints", "gathered in time"}
DIAGNOSIS = "every rank kept the full checkpoints"


def sharded_forward(dist, x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x)
            x = block(x, w1, w2)
    return saved, x


def sharded_backward(dist, saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
