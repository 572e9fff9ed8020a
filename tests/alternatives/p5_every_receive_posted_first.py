"""p5, another style: each stage posts the irecv of every microbatch's activation before computing anything, and,
after its forwards, the irecv of every gradient; it then works through the microbatches as their messages come
in, sending each result with isend. The receives are posted long before their data arrives: the schedule is read
from when each message arrived, not from when it was asked for."""

import torch

from puzzles.model import forward, loss_fn


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    if first:
        inputs = [x.chunk(n_micro)[i].detach() for i in range(n_micro)]
    else:
        inputs = [torch.empty(micro_shape, dtype=torch.float64) for _ in range(n_micro)]
        posted = [dist.irecv(a, rank - 1) for a in inputs]
    outputs, sends = [], []
    for i in range(n_micro):
        if not first:
            posted[i].wait()
        inputs[i].requires_grad_()
        y = forward(inputs[i], layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            sends.append(dist.isend(y.detach(), rank + 1))
        outputs.append(y)
    if not last:
        grads = [torch.empty(micro_shape, dtype=torch.float64) for _ in range(n_micro)]
        coming = [dist.irecv(g, rank + 1) for g in reversed(grads)]  # they come back newest first
    for k, i in enumerate(reversed(range(n_micro))):
        if last:
            outputs[i].backward()
        else:
            coming[k].wait()
            outputs[i].backward(grads[i])
        if not first:
            sends.append(dist.isend(inputs[i].grad, rank - 1))
    for work in sends:
        work.wait()
    return torch.cat([a.grad for a in inputs])
