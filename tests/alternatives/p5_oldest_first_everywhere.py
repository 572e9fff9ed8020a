"""p5, another style: every rank runs its backwards oldest microbatch first (the order the activations went out),
with torch.autograd.backward and a dict of the microbatches held."""

import torch

from puzzles.model import forward, loss_fn


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    held = {}
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        a.requires_grad_()
        y = forward(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            dist.send(y.detach(), dst=rank + 1)
        held[i] = (a, y)
    grads = []
    for i in range(n_micro):  # oldest first, on every rank
        a, y = held.pop(i)
        if last:
            torch.autograd.backward(y)
        else:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            torch.autograd.backward(y, g)
        grads.append(a.grad)
        if not first:
            dist.send(a.grad, dst=rank - 1)
    return torch.cat(grads)
