"""p2 mistake: the forward keeps only the shards but runs with autograd on, so the graph of the whole stack stays
alive behind y until the backward."""

import torch

from puzzles.model import block, forward

MISTAKE = "the forward runs with autograd on, keeping the whole graph alive"
EXPECTED_FAILURES = {"checkpoint bytes", "peak memory"}
DIAGNOSIS = "it built the autograd graph"


def sharded_forward(dist, x, layers, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = []
    for i, (w1, w2) in enumerate(layers):
        if i % k == 0:
            saved.append(x.detach().chunk(world)[rank].clone())
        x = block(x, w1, w2)
    return saved, x


def sharded_backward(dist, saved, layers, k, grad_y):
    world = dist.get_world_size()
    grad = grad_y
    for s in reversed(range(len(saved))):
        shard = saved[s]
        full = torch.empty(shard.shape[0] * world, *shard.shape[1:], dtype=shard.dtype)
        dist.all_gather_into_tensor(full, shard)
        start = full.requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del full, start, out
    return grad
