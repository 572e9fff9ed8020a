"""p6 mistake: a right 1F1B schedule, but each backward hands the weights' gradients to w.grad by assignment
(torch.autograd.grad, then w.grad = g), so w.grad keeps the last microbatch's contribution only."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "w.grad is overwritten with each microbatch's gradient instead of accumulated"
EXPECTED_FAILURES = {"stage gradients", "stage-0 activation memory"}
DIAGNOSIS = "w.grad was overwritten"


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    weights = [w for pair in layers for w in pair]
    held, input_grads = deque(), [None] * n_micro

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
        return y.detach()

    def backward_step(g):
        i, a, y = held.popleft()
        grads = torch.autograd.grad(y, [a, *weights], g)
        for w, gw in zip(weights, grads[1:]):
            w.grad = gw  # should accumulate
        input_grads[i] = grads[0]
        return grads[0]

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
