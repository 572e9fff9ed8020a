"""p6 mistake: a right 1F1B schedule, but every microbatch's stage input and output are also appended to lists
"for the return value" and never dropped, so rank 0 ends up holding all m microbatches' graphs' inputs and
outputs, and the autograd graphs' saved tensors stay alive with them."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "every microbatch's graph is kept in a list after its backward"
EXPECTED_FAILURES = {"stage-0 activation memory"}
DIAGNOSIS = "kept more alive than their activations"


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    held, input_grads, kept = deque(), [None] * n_micro, []

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
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        return act, grad

    def forward_step(i, a):
        a = (x.chunk(n_micro)[i].detach() if first else a).requires_grad_()
        y = forward(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        held.append((i, a, y))
        kept.append((a, y))  # never dropped
        return y.detach()

    def backward_step(g):
        i, a, y = held.popleft()
        y.backward(g, retain_graph=True)  # and the graph kept too
        input_grads[i] = a.grad
        return a.grad

    warmup = min(world - 1 - rank, n_micro)
    a, _ = exchange(recv_prev=True)
    for i in range(warmup):
        y = forward_step(i, a)
        a, _ = exchange(send_next=y, recv_prev=i + 1 < n_micro)
    for i in range(warmup, n_micro):
        y = forward_step(i, a)
        _, g = exchange(send_next=y, recv_next=True)
        dx = backward_step(g)
        a, _ = exchange(send_prev=dx, recv_prev=i + 1 < n_micro)
    for _ in range(warmup):
        _, g = exchange(recv_next=True)
        dx = backward_step(g)
        exchange(send_prev=dx)
    return torch.cat(input_grads)
