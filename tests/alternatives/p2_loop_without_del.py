"""p2, another style: no `del` anywhere; each segment's names are simply rebound by the next iteration, so the
previous checkpoint and output are still alive (on their way out) when the next gather starts."""

import torch

from puzzles.model import block, forward


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
        full = torch.empty(saved[s].shape[0] * world, saved[s].shape[1], dtype=saved[s].dtype)
        dist.all_gather_into_tensor(full, saved[s])
        start = full.requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
    return grad
