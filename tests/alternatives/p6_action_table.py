"""p6, another style: each rank first writes its schedule down as a table of actions, ("F", i) and ("B", i), as
torch.distributed.pipelining does, then runs it. Before each action, the previous action's result is sent and the
action's own input received, both posted together."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn


def schedule(rank, world, n_micro):
    """1F1B for one rank: p-1-rank warm-up forwards, one forward and one backward at a time, the cool-down."""
    warmup = min(world - 1 - rank, n_micro)
    actions = [("F", i) for i in range(warmup)]
    for i in range(warmup, n_micro):
        actions += [("F", i), ("B", i - warmup)]
    actions += [("B", i) for i in range(n_micro - warmup, n_micro)]
    return actions


def one_f_one_b_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    held, input_grads, outgoing = deque(), [None] * n_micro, None

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

    for kind, i in schedule(rank, world, n_micro):
        if kind == "F":
            a = exchange(None if first else rank - 1)
            a = (x.chunk(n_micro)[i].detach() if first else a).requires_grad_()
            y = forward(a, layers)
            if last:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            held.append((i, a, y))
            outgoing = None if last else (y.detach(), rank + 1)
        else:
            g = exchange(None if last else rank + 1)
            j, a, y = held.popleft()
            y.backward(g)
            input_grads[j] = a.grad
            outgoing = None if first else (a.grad, rank - 1)
    exchange()
    return torch.cat(input_grads)
