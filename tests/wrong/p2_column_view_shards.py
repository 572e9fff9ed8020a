"""p2 mistake: sharding the checkpoints by columns and keeping the column views themselves. gloo gathers a strided
input correctly (tests/corpus/layouts.py), so the gather runs; but all_gather_into_tensor concatenates the ranks'
shards along dim 0, so the "checkpoint" rebuilt from column shards is not the block input, and every gradient is
off (and the views keep each whole checkpoint alive besides)."""

import torch

from puzzles.model import block, forward

MISTAKE = "the shards are non-contiguous column views, all-gathered as they are"
EXPECTED_FAILURES = {"gradients", "checkpoint bytes"}
DIAGNOSIS = "along dim 0"


def sharded_forward(dist, x, layers, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x.chunk(world, dim=1)[rank])  # a strided view
            x = block(x, w1, w2)
    return saved, x


def sharded_backward(dist, saved, layers, k, grad_y):
    world = dist.get_world_size()
    grad = grad_y
    for s in reversed(range(len(saved))):
        shard = saved[s]
        full = torch.empty(shard.shape[0], shard.shape[1] * world, dtype=shard.dtype)
        dist.all_gather_into_tensor(full, shard)
        start = full.requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del full, start, out
    return grad
