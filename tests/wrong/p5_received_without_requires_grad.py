"""p5 mistake: a stage runs its forward on the received activation without making it require grad: backward
never fills its .grad, and the stage sends None back to the stage before it."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the received activations are not made to require grad, so their .grad stays None"
EXPECTED_STATUS = "error"
DIAGNOSIS = "a.requires_grad_()"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs, outputs = [], []
    for i in range(n_micro):  # all forwards, microbatch 0 first
        with torch.profiler.record_function(f"F{i}"):
            if first:
                a = x.chunk(n_micro)[i].detach().requires_grad_()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(a, src=rank - 1)
            y = forward(a, layers)
            if last:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):  # all backwards, the newest microbatch first (every rank in the same order)
        with torch.profiler.record_function(f"B{i}"):
            if last:
                outputs[i].backward()
            else:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, src=rank + 1)
                outputs[i].backward(g)
            input_grads[i] = inputs[i].grad
            if not first:
                dist.send(input_grads[i], dst=rank - 1)
        inputs[i] = outputs[i] = None  # microbatch i's activations can go
    return torch.cat(input_grads)
