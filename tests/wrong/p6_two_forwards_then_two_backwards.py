"""p6 mistake: after the warm-up, the steady state runs two forwards, then two backwards ("1F1B in pairs"):
every rank holds one microbatch more than p - rank. (Sends are isend, waited for at the end, so that no order
of sends can deadlock.)"""

from collections import deque

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the steady state alternates two forwards and two backwards instead of one and one"
EXPECTED_FAILURES = {"1F1B schedule", "bubble", "stage-0 activation memory"}
DIAGNOSIS = "two forwards in a row"


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    held, input_grads, pending = deque(), [None] * n_micro, []

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
            pending.append(dist.isend(y.detach(), rank + 1))
        held.append((i, a, y))

    def backward_step():
        i, a, y = held.popleft()
        y.backward(None if last else receive(rank + 1))
        input_grads[i] = a.grad
        if not first:
            pending.append(dist.isend(a.grad, rank - 1))

    warmup = min(world - 1 - rank, n_micro)
    for i in range(warmup):
        forward_step(i)
    for i in range(warmup, n_micro, 2):  # pairs: F F B B
        for j in range(i, min(i + 2, n_micro)):
            forward_step(j)
        for _ in range(min(2, n_micro - i)):
            backward_step()
    while held:
        backward_step()
    for work in pending:
        work.wait()
    return torch.cat(input_grads)
