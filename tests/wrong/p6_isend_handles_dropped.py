"""p6 mistake: 1F1B whose sends are isend handles that are never waited for (the receiver waits, so "it works").
On real backends a send buffer must live until its wait(); a dropped handle is a bug that the simulator reports
once dropped handles are an error."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the isend handles are dropped without wait()"
EXPECTED_STATUS = "error"
DIAGNOSIS = "wait()"


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    held, input_grads = deque(), [None] * n_micro

    def receive(src):
        buf = torch.empty(micro_shape, dtype=torch.float64)
        dist.recv(buf, src=src)
        return buf

    def forward_step(i):
        a = (x.chunk(n_micro)[i].detach() if first else receive(rank - 1)).requires_grad_()
        y = forward(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            dist.isend(y.detach(), rank + 1)  # handle dropped
        held.append((i, a, y))

    def backward_step():
        i, a, y = held.popleft()
        y.backward(None if last else receive(rank + 1))
        input_grads[i] = a.grad
        if not first:
            dist.isend(a.grad, rank - 1)  # handle dropped

    warmup = min(world - 1 - rank, n_micro)
    for i in range(warmup):
        forward_step(i)
    for i in range(warmup, n_micro):
        forward_step(i)
        backward_step()
    while held:
        backward_step()
    return torch.cat(input_grads)
