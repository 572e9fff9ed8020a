"""p6 cheat: GPipe's order (all forwards, then all backwards), keeping only each microbatch's stage input and
recomputing the stage in backward: rank 0's memory fits the 1F1B budget, but it holds all m microbatches before
its first backward, and computes every forward twice."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "GPipe's order with recomputation instead of 1F1B"
EXPECTED_FAILURES = {"stage compute", "bubble", "1F1B schedule"}
DIAGNOSIS = "recomputation"


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs = []
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        with torch.no_grad():
            y = forward(a, layers)
        if not last:
            dist.send(y, dst=rank + 1)
        inputs.append(a)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):
        a = inputs[i].requires_grad_()
        y = forward(a, layers)
        if last:
            (loss_fn(y, target.chunk(n_micro)[i]) / n_micro).backward()
        else:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            y.backward(g)
        input_grads[i] = a.grad
        inputs[i] = None
        if not first:
            dist.send(a.grad, dst=rank - 1)
    return torch.cat(input_grads)
