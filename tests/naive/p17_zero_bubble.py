"""Naive p17: puzzle 6's 1F1B, the backward whole (y.backward(g) computes the input gradient and the weight
gradients at once). Same gradients, the same memory, but its bubble is 1F1B's, (p-1)·(F + BW) = 12,120 ticks idle,
and every input gradient waits behind its microbatch's weight gradients."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn

EXPECTED_FAILURES = {"bubble", "B before W"}
DIAGNOSIS = "the backward was not split"


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1

    def exchange(send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        """Post the sends and receives of one step together, so that no two neighbours wait on each other."""
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

    held = deque()  # (i, stage input, stage output) of the microbatches forwarded and not yet backwarded
    input_grads = [None] * n_micro

    def forward_step(i, a):
        with torch.profiler.record_function(f"F{i}"):
            a = (x.chunk(n_micro)[i].detach() if first else a).requires_grad_()
            y = forward(a, layers)
            if last:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        held.append((i, a, y))
        return y.detach()

    def backward_step(g):
        i, a, y = held.popleft()  # the oldest microbatch: its gradient is the one that comes back next
        with torch.profiler.record_function(f"B{i}"):
            y.backward(g)
        input_grads[i] = a.grad
        return a.grad

    warmup = min(world - 1 - rank, n_micro)
    a, _ = exchange(recv_prev=True)
    for i in range(warmup):
        y = forward_step(i, a)
        a, _ = exchange(send_next=y, recv_prev=i + 1 < n_micro)
    for i in range(warmup, n_micro):  # steady state: one forward, one backward
        y = forward_step(i, a)
        _, g = exchange(send_next=y, recv_next=True)
        dx = backward_step(g)
        a, _ = exchange(send_prev=dx, recv_prev=i + 1 < n_micro)
    for _ in range(warmup):  # cool-down: the backwards left over
        _, g = exchange(recv_next=True)
        dx = backward_step(g)
        exchange(send_prev=dx)
    return torch.cat(input_grads)
