"""p5 mistake: each microbatch's loss is backpropagated unscaled, so the accumulated gradients are the sum of the
m microbatch gradients: m = 8 times the full-batch gradient (the loss is a mean over the rows)."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the microbatch losses are not scaled by 1/m"
EXPECTED_FAILURES = {"stage gradients", "input gradients"}
DIAGNOSIS = "exactly 8x the reference"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs, outputs = [], []
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        a.requires_grad_()
        y = forward(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i])  # missing: / n_micro
        else:
            dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    grads = [None] * n_micro
    for i in reversed(range(n_micro)):
        if last:
            outputs[i].backward()
        else:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            outputs[i].backward(g)
        grads[i] = inputs[i].grad
        if not first:
            dist.send(grads[i], dst=rank - 1)
    return torch.cat(grads)
