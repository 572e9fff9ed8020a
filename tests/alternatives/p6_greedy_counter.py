"""p6, another style: no warm-up arithmetic. Each rank runs a forward whenever it holds fewer than p - rank
microbatches and has forwards left, and a backward otherwise: the count alone yields the 1F1B order."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    limit = world - rank
    held, input_grads, outgoing = deque(), [None] * n_micro, None
    forwards = backwards = 0

    def exchange(recv_from=None):
        ops, buf = [], None
        if outgoing is not None:
            ops.append(dist.P2POp(dist.isend, *outgoing))
        if recv_from is not None:
            buf = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, buf, recv_from))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        return buf

    while backwards < n_micro:
        if forwards < n_micro and len(held) < limit:
            a = exchange(None if first else rank - 1)
            a = (x.chunk(n_micro)[forwards].detach() if first else a).requires_grad_()
            y = forward(a, layers)
            if last:
                y = loss_fn(y, target.chunk(n_micro)[forwards]) / n_micro
            held.append((forwards, a, y))
            outgoing = None if last else (y.detach(), rank + 1)
            forwards += 1
        else:
            g = exchange(None if last else rank + 1)
            i, a, y = held.popleft()
            y.backward(g)
            input_grads[i] = a.grad
            outgoing = None if first else (a.grad, rank - 1)
            backwards += 1
    exchange()
    return torch.cat(input_grads)
