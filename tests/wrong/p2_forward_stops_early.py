"""p2 mistake: the forward stops one block short, as if the last block belonged to another stage: y is the last
block's input on every rank."""

import torch

from puzzles.model import block, forward

MISTAKE = "the forward runs one block fewer than the stack has"
EXPECTED_FAILURES = {"output", "gradients"}
DIAGNOSIS = "the forward ran blocks 0 to 14 only"


def sharded_forward(dist, x, layers, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers[:-1]):
            if i % k == 0:
                saved.append(x.chunk(world)[rank].clone())
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
