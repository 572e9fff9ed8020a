"""p2 mistake: each checkpoint is all-gathered just before its segment, as it should be, but the gathered buffers
are kept in a list until the end of the backward: by the last segment every checkpoint is whole again."""

import torch

from puzzles.model import block, forward

MISTAKE = "each checkpoint is gathered just in time, but every gathered checkpoint is kept until the end"
EXPECTED_FAILURES = {"gathered checkpoints"}
DIAGNOSIS = "each gathered checkpoint was kept"


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
    grad, gathered = grad_y, []
    for s in reversed(range(len(saved))):
        shard = saved[s]
        full = torch.empty(shard.shape[0] * world, *shard.shape[1:], dtype=shard.dtype)
        dist.all_gather_into_tensor(full, shard)
        gathered.append(full)  # kept "in case"
        start = full.detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
