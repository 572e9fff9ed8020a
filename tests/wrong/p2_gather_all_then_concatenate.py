"""p2 mistake: all-gathering every checkpoint's pieces with all_gather (a list per checkpoint) at the start of the
backward and concatenating them: the gather buffers die at once, but the concatenated checkpoints are all whole,
together, for the whole backward."""

import torch

from puzzles.model import block, forward

MISTAKE = "all checkpoints are gathered (as lists) and concatenated up front"
EXPECTED_FAILURES = {"gathered in time"}
DIAGNOSIS = "you gathered them all up front"


def sharded_forward(dist, x, layers, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x.chunk(world)[rank].clone())
            x = block(x, w1, w2)
    return saved, x


def gather(dist, shard):
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard)
    return torch.cat(parts)


def sharded_backward(dist, saved, layers, k, grad_y):
    checkpoints = [gather(dist, shard) for shard in saved]  # everything, first
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = checkpoints[s].requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
