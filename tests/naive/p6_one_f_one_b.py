"""Naive p6: the GPipe schedule of puzzle 5 (all forwards, then all backwards). Same gradients, same bubble,
but rank 0 holds all m = 8 microbatches' activations before its first backward, where 1F1B holds p = 4."""

import torch

from puzzles.model import forward, loss_fn

EXPECTED_FAILURES = {"1F1B schedule", "stage-0 activation memory"}
DIAGNOSIS = "still all forwards before all backwards"


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs, outputs = [], []
    for i in range(n_micro):  # all forwards, microbatch 0 first
        with torch.profiler.record_function(f"F{i}"):
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
