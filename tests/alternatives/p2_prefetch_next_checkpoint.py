"""p2, another style: while a segment is recomputed and backpropagated, the next checkpoint's all-gather is
already in flight (async_op=True), as FSDP prefetches: two gathered checkpoints alive at a time."""

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


def gather(dist, shard):
    full = torch.empty(shard.shape[0] * dist.get_world_size(), *shard.shape[1:], dtype=shard.dtype)
    return full, dist.all_gather_into_tensor(full, shard, async_op=True)


def sharded_backward(dist, saved, layers, k, grad_y):
    grad = grad_y
    nxt = gather(dist, saved[-1])
    for s in reversed(range(len(saved))):
        full, work = nxt
        work.wait()
        nxt = gather(dist, saved[s - 1]) if s > 0 else None  # prefetch the next one
        start = full.requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del full, work, start, out
    return grad
