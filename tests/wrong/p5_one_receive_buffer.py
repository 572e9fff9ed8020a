"""p5 mistake: each stage receives every microbatch's activations into the same buffer, allocated once. The
graphs of earlier microbatches saved that buffer for backward (x @ w1 keeps x to compute w1's gradient), and the
later receives overwrite it: w1's gradient of each stage's first block is off, and nothing else."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "one receive buffer is reused for every microbatch's activations"
EXPECTED_FAILURES = {"stage gradients"}
DIAGNOSIS = "one receive buffer reused"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    buffer = torch.empty(micro_shape, dtype=torch.float64)  # one for all microbatches
    inputs, outputs = [], []
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            dist.recv(buffer, src=rank - 1)
            a = buffer.detach()
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
