"""p6, another style: the reference's schedule, with each step's send and receive posted as an isend and an
irecv (no batch_isend_irecv), then both waited for; named helpers for the four exchanges."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1

    def post(send=None, recv=None):
        """send: (tensor, peer) or None; recv: a peer or None. Both are posted before either is waited for."""
        works, buf = [], None
        if send is not None:
            works.append(dist.isend(send[0], dst=send[1]))
        if recv is not None:
            buf = torch.empty(micro_shape, dtype=torch.float64)
            works.append(dist.irecv(buf, src=recv))
        for work in works:
            work.wait()
        return buf

    def send_forward_recv_forward(y, more):
        return post((y, rank + 1) if not last else None, rank - 1 if more and not first else None)

    def send_forward_recv_backward(y):
        return post((y, rank + 1) if not last else None, rank + 1 if not last else None)

    def send_backward_recv_forward(dx, more):
        return post((dx, rank - 1) if not first else None, rank - 1 if more and not first else None)

    held, input_grads = deque(), [None] * n_micro

    def forward_step(i, a):
        a = (x.chunk(n_micro)[i].detach() if first else a).requires_grad_()
        y = forward(a, layers)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        held.append((i, a, y))
        return y.detach()

    def backward_step(g):
        i, a, y = held.popleft()
        y.backward(g)
        input_grads[i] = a.grad
        return a.grad

    warmup = min(world - 1 - rank, n_micro)
    a = post(recv=None if first else rank - 1)
    for i in range(warmup):
        a = send_forward_recv_forward(forward_step(i, a), i + 1 < n_micro)
    for i in range(warmup, n_micro):
        g = send_forward_recv_backward(forward_step(i, a))
        a = send_backward_recv_forward(backward_step(g), i + 1 < n_micro)
    for _ in range(warmup):
        dx = backward_step(post(recv=None if last else rank + 1))
        post(send=None if first else (dx, rank - 1))
    return torch.cat(input_grads)
