"""p2 mistake: sharding the checkpoints by columns and keeping the column views themselves: all-gathering a
non-contiguous tensor, which NCCL refuses (gloo copies it; the simulator refuses it, as NCCL does:
tests/corpus/layouts.py), and the view keeps the whole checkpoint alive anyway."""

import torch

from puzzles.model import block, forward

MISTAKE = "the shards are non-contiguous column views, all-gathered as they are"
EXPECTED_STATUS = "error"
DIAGNOSIS = "contiguous"


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
