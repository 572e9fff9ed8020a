"""p6 mistake: 1F1B with blocking sends. In the steady state rank r sends an activation forward (and waits for
rank r+1 to receive it) while rank r+1 sends a gradient back (and waits for rank r): both send first. A deadlock,
named; batch_isend_irecv (or isend/irecv) posts the send and the receive together."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "1F1B with blocking sends: neighbours both send first"
EXPECTED_STATUS = "error"
DIAGNOSIS = "both send first"


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    held, grads = deque(), [None] * n_micro

    def forward_step(i):
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
            dist.send(y.detach(), dst=rank + 1)  # blocks until rank + 1 receives it
        held.append((i, a, y))

    def backward_step():
        i, a, y = held.popleft()
        if last:
            y.backward()
        else:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            y.backward(g)
        grads[i] = a.grad
        if not first:
            dist.send(a.grad, dst=rank - 1)  # blocks until rank - 1 receives it

    warmup = min(world - 1 - rank, n_micro)
    for i in range(warmup):
        forward_step(i)
    for i in range(warmup, n_micro):
        forward_step(i)
        backward_step()
    for _ in range(warmup):
        backward_step()
    return torch.cat(grads)
