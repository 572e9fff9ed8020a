"""p5 mistake: the last stage runs its backwards oldest first (microbatch 0, 1, ..., 7) while the other stages run
theirs newest first, so rank 2 backpropagates microbatch 0's gradient through microbatch 7's activations: a
gradient received for the wrong microbatch. Every rank before the last one is wrong."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the last stage runs its backwards in another order than the other stages"
EXPECTED_FAILURES = {"stage gradients", "input gradients"}
DIAGNOSIS = "gradient received for the wrong microbatch"


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
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    grads = [None] * n_micro
    order = range(n_micro) if last else reversed(range(n_micro))  # the two sides disagree on the order
    for i in order:
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
