"""p2 mistake (of a kind): the shards are kept, but never gathered: the backward rebuilds each checkpoint by
running the stack again from x, which every rank holds anyway. Right values and memory, but the rebuilding costs
a forward through every block before the segment, for every segment. Nothing is gathered: the gather checks fail
too, and say the checkpoints were rebuilt."""

import torch

from puzzles.model import block, forward

MISTAKE = "each checkpoint is rebuilt from the input x instead of all-gathered from the shards"
EXPECTED_FAILURES = {"compute", "gathered checkpoints", "gathered in time"}
DIAGNOSIS = "recomputed from the stack's input"


def sharded_forward(dist, x, layers, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = [x]  # x is alive anyway; the shards below are never used
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if 0 < i and i % k == 0:
                saved.append(x.chunk(world)[rank].clone())
            x = block(x, w1, w2)
    return saved, x


def sharded_backward(dist, saved, layers, k, grad_y):
    x, grad = saved[0], grad_y
    for s in reversed(range(len(saved))):
        with torch.no_grad():
            start = forward(x, layers[:s * k])  # rebuilt from the input, not gathered
        start = start.detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
