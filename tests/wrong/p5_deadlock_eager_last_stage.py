"""p5 mistake: the last stage backpropagates each microbatch as soon as it has its loss, and sends the gradient
back with a blocking send while rank 2 is still blocked sending it the next activation: both send first, and a
blocking send waits for its recv. A deadlock, named."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the last stage sends gradients back while the stage before it is still sending activations: both send first"
EXPECTED_STATUS = "error"
DIAGNOSIS = "both send first"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs, outputs, grads = [], [], [None] * n_micro
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        a.requires_grad_()
        y = forward(a, layers)
        if last:  # backward at once, and send the gradient back right away
            (loss_fn(y, target.chunk(n_micro)[i]) / n_micro).backward()
            grads[i] = a.grad
            dist.send(a.grad, dst=rank - 1)
        else:
            dist.send(y.detach(), dst=rank + 1)
            inputs.append(a)
            outputs.append(y)
    if not last:
        for i in range(n_micro):
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            outputs[i].backward(g)
            grads[i] = inputs[i].grad
            if not first:
                dist.send(grads[i], dst=rank - 1)
    return torch.cat(grads)
