"""p2, another style: no collective at all. Right before recomputing a segment, each rank sends its rows of the
segment's checkpoint to every other rank (isend) and receives theirs into their rows of a fresh [B, d] buffer
(irecv): the checkpoint is put together by point-to-point messages, one segment at a time."""

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


def put_together(dist, shard):
    """The whole checkpoint from every rank's rows, by messages: [B, d]."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = shard.shape[0]
    full = torch.empty(rows * world, *shard.shape[1:], dtype=shard.dtype)
    full[rank * rows:(rank + 1) * rows] = shard
    works = []
    for peer in range(world):
        if peer != rank:
            works.append(dist.isend(shard, peer))
            works.append(dist.irecv(full[peer * rows:(peer + 1) * rows], peer))
    for work in works:
        work.wait()
    return full


def sharded_backward(dist, saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = put_together(dist, saved[s]).requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
