"""p6, another style: the reference's schedule, with every send an isend kept in a list of pending sends; at each
exchange the rank looks at each pending send once with is_completed(), waits for and drops those that say so, and
moves on (never a loop on one handle); whatever is left is waited for at the end. On gloo a send's handle says
False until it is waited for, so the list keeps every send to the end, and gloo runs it as written."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    pending = []  # sends not known to be done

    def post(send=None, recv=None):
        """send: (tensor, peer) or None; recv: a peer or None."""
        if send is not None:
            pending.append(dist.isend(send[0], dst=send[1]))
        for work in list(pending):  # one look at each, then on
            if work.is_completed():
                work.wait()
                pending.remove(work)
        buf = None
        if recv is not None:
            buf = torch.empty(micro_shape, dtype=torch.float64)
            dist.irecv(buf, src=recv).wait()
        return buf

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
        y = forward_step(i, a)
        a = post((y, rank + 1) if not last else None, rank - 1 if i + 1 < n_micro and not first else None)
    for i in range(warmup, n_micro):
        y = forward_step(i, a)
        g = post((y, rank + 1) if not last else None, rank + 1 if not last else None)
        dx = backward_step(g)
        a = post((dx, rank - 1) if not first else None, rank - 1 if i + 1 < n_micro and not first else None)
    for _ in range(warmup):
        dx = backward_step(post(recv=None if last else rank + 1))
        post(send=None if first else (dx, rank - 1))
    for work in pending:
        work.wait()
    return torch.cat(input_grads)
