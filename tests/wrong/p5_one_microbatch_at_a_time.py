"""p5 mistake: microbatches, but each goes forward through every stage and back before the next one starts. The
gradients are right, but only one stage ever works at a time: the bubble is as bad as one big microbatch."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "each microbatch goes through the whole pipeline and back before the next one starts"
EXPECTED_FAILURES = {"bubble"}
DIAGNOSIS = "before the forward of the next microbatch"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    grads = []
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        a.requires_grad_()
        y = forward(a, layers)
        if last:
            (loss_fn(y, target.chunk(n_micro)[i]) / n_micro).backward()
        else:
            dist.send(y.detach(), dst=rank + 1)
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)  # waits for this microbatch to come all the way back
            y.backward(g)
        if not first:
            dist.send(a.grad, dst=rank - 1)
        grads.append(a.grad)
    return torch.cat(grads)
