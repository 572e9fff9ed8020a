"""p2 mistake: all-reducing the gradients across the ranks, as in data parallel. Every rank already runs the whole
stack on the whole batch, so its gradients are complete; the sum is N times too large."""

import torch

from puzzles.model import block, forward

MISTAKE = "the gradients are all-reduced (summed) across ranks that already hold complete gradients"
EXPECTED_FAILURES = {"gradients"}
DIAGNOSIS = "did you all-reduce (sum) the gradients"


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
    for w1, w2 in layers:  # not needed: every rank's gradients are already the whole batch's
        dist.all_reduce(w1.grad)
        dist.all_reduce(w2.grad)
    return grad
