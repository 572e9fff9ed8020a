"""Naive p5: the whole batch as one microbatch. The gradients are right, but only one stage works at a time, so
each rank idles (p-1)/p = 75% of the makespan."""

import torch

from puzzles.model import forward, loss_fn

EXPECTED_FAILURES = {"bubble"}
DIAGNOSIS = "the whole batch as one microbatch"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = (micro_shape[0] * n_micro, micro_shape[1])
    if rank == 0:
        a = x.detach()
    else:
        a = torch.empty(shape, dtype=torch.float64)
        dist.recv(a, src=rank - 1)
    a.requires_grad_()
    y = forward(a, layers)
    if rank == world - 1:
        loss_fn(y, target).backward()
    else:
        dist.send(y.detach(), dst=rank + 1)
        g = torch.empty(shape, dtype=torch.float64)
        dist.recv(g, src=rank + 1)
        y.backward(g)
    if rank > 0:
        dist.send(a.grad, dst=rank - 1)
    return a.grad
