"""p17 mistake (found by attacking the puzzle from its stub): puzzle 6's exchanges kept, B split from W and r W's
deferred on rank r as ZB-H1 asks, but each W run after the exchange that waits for the next activation. A W
placed after a receive that blocks cannot fill the wait; the ranks idle nearly as long as in 1F1B."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "each deferred W run after the receive that blocks, not before it"
EXPECTED_FAILURES = {"bubble"}
DIAGNOSIS = "a W belongs before the receive that blocks"


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    weights = [w for pair in layers for w in pair]

    def exchange(send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        ops, act, grad = [], None, None
        if send_next is not None and not last:
            ops.append(dist.P2POp(dist.isend, send_next, rank + 1))
        if send_prev is not None and not first:
            ops.append(dist.P2POp(dist.isend, send_prev, rank - 1))
        if recv_prev and not first:
            act = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, act, rank - 1))
        if recv_next and not last:
            grad = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, grad, rank + 1))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return act, grad

    held = deque()
    pending = deque()
    input_grads = [None] * n_micro

    def forward_step(i, a):
        a = (x.chunk(n_micro)[i].detach() if first else a).requires_grad_()
        y = forward(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        held.append((i, a, y))
        return y.detach()

    def b_step(g):
        i, a, y = held.popleft()
        (dx,) = torch.autograd.grad(y, a, g, retain_graph=True)
        input_grads[i] = dx
        pending.append((y, g))
        return dx

    def w_step():
        y, g = pending.popleft()
        with torch.profiler.record_function("W"):
            y.backward(g, inputs=weights)

    warmup = min(world - 1 - rank, n_micro)
    a, _ = exchange(recv_prev=True)
    for i in range(warmup):
        y = forward_step(i, a)
        a, _ = exchange(send_next=y, recv_prev=i + 1 < n_micro)
    for i in range(warmup, n_micro):
        y = forward_step(i, a)
        _, g = exchange(send_next=y, recv_next=True)
        dx = b_step(g)
        a, _ = exchange(send_prev=dx, recv_prev=i + 1 < n_micro)
        if len(pending) > rank:
            w_step()
    for _ in range(warmup):
        _, g = exchange(recv_next=True)
        dx = b_step(g)
        exchange(send_prev=dx)
        if len(pending) > rank:
            w_step()
    while pending:
        w_step()
    return torch.cat(input_grads)
