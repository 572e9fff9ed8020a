"""p5 mistake: every stage takes each microbatch's weight gradients with torch.autograd.grad and assigns them to
w.grad, overwriting instead of accumulating: w.grad ends up holding the last microbatch's contribution only. The
input gradients, one per microbatch, are right."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "w.grad is overwritten with each microbatch's gradient instead of accumulated"
EXPECTED_FAILURES = {"stage gradients"}
DIAGNOSIS = "w.grad was overwritten"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    weights = [w for pair in layers for w in pair]
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
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):
        g = None
        if not last:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
        grads = torch.autograd.grad(outputs[i], [inputs[i], *weights], g)
        input_grads[i] = grads[0]
        for w, gw in zip(weights, grads[1:]):
            w.grad = gw  # should be: w.grad += gw
        if not first:
            dist.send(input_grads[i], dst=rank - 1)
    return torch.cat(input_grads)
