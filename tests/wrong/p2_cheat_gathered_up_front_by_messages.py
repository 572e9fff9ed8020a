"""p2 cheat (issue 29): every checkpoint put together at the start of the backward, by isend/irecv of each rank's
rows instead of an all-gather. The old check counted only all-gathers (and whole-buffer all-reduces and
broadcasts): nothing was gathered, so nothing was gathered late, and it passed. Every message that brings other
ranks' rows counts now, whatever call carried it: all L/k checkpoints waited for their segments at once."""

import torch
from puzzles.model import block, forward

MISTAKE = "every checkpoint gathered at the start of the backward, by point-to-point messages"
EXPECTED_FAILURES = {"gathered in time"}
DIAGNOSIS = "you gathered them all up front"

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
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = saved[0].shape[0]
    fulls = [torch.empty(rows * world, *s.shape[1:], dtype=s.dtype) for s in saved]
    works = []
    for full, shard in zip(fulls, saved):   # every checkpoint put together up front, by messages
        full[rank * rows:(rank + 1) * rows] = shard
        for peer in range(world):
            if peer != rank:
                works.append(dist.isend(shard, peer))
                works.append(dist.irecv(full[peer * rows:(peer + 1) * rows], peer))
    for w in works:
        w.wait()
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = fulls[s].requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        fulls[s] = None
        del start, out
    return grad
