"""p2 mistake: all-gathering every checkpoint at the start of the backward. Right gradients and shards, but all
L/k whole checkpoints are alive together again for the whole backward."""

import torch

from puzzles.model import block, forward

MISTAKE = "every checkpoint is all-gathered at the start of the backward"
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


def sharded_backward(dist, saved, layers, k, grad_y):
    world = dist.get_world_size()
    fulls = []
    for shard in saved:
        full = torch.empty(shard.shape[0] * world, *shard.shape[1:], dtype=shard.dtype)
        dist.all_gather_into_tensor(full, shard)
        fulls.append(full)
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = fulls[s].requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
