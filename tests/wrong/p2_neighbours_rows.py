"""p2 mistake: each rank keeps its neighbour's rows (rank r keeps chunk r+1), so the gathered checkpoint has its
row blocks in the wrong order: every recompute starts from a scrambled checkpoint."""

import torch

from puzzles.model import block, forward

MISTAKE = "rank r keeps the rows of rank r+1, so the gathered checkpoints are scrambled"
EXPECTED_FAILURES = {"gradients"}
DIAGNOSIS = "keep the shard `c.chunk(N)[rank]`"


def sharded_forward(dist, x, layers, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x.chunk(world)[(rank + 1) % world].clone())
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
