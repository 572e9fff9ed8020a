"""p5 mistake: the last stage pairs microbatch i with the targets of microbatch m-1-i (it counts them from the
end): its own loss is wrong, so everything before it is too."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the last stage takes the targets of the wrong microbatch"
EXPECTED_FAILURES = {"stage gradients", "input gradients"}
DIAGNOSIS = "the last stage, is off"


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
            y = loss_fn(y, target.chunk(n_micro)[n_micro - 1 - i]) / n_micro
        else:
            dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):
        if last:
            outputs[i].backward()
        else:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            outputs[i].backward(g)
        input_grads[i] = inputs[i].grad
        if not first:
            dist.send(input_grads[i], dst=rank - 1)
    return torch.cat(input_grads)
