"""p16, another style, Megatron-LM's: each step's sends and receives posted together with batch_isend_irecv and
waited for at once (send an output, send a gradient, receive the next input, receive the next gradient), so that
no two neighbours wait on each other; the forwards and backwards in between."""

import torch

from puzzles.model import forward, loss_fn


def interleaved_step(dist, chunks, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    S = v * world
    total = n_micro * v

    def fwd_unit(j):
        g, k = divmod(j, world * v)
        return k // world, g * world + k % world

    def bwd_unit(j):
        c, i = fwd_unit(j)
        return v - 1 - c, i

    def stage(c):
        return c * world + rank

    def p2p(send_fwd=None, send_bwd=None, recv_fwd=False, recv_bwd=False):
        ops, a, g = [], None, None
        if send_fwd is not None:
            ops.append(dist.P2POp(dist.isend, send_fwd, (rank + 1) % world))
        if send_bwd is not None:
            ops.append(dist.P2POp(dist.isend, send_bwd, (rank - 1) % world))
        if recv_fwd:
            a = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, a, (rank - 1) % world))
        if recv_bwd:
            g = torch.empty(micro_shape, dtype=torch.float64)
            ops.append(dist.P2POp(dist.irecv, g, (rank + 1) % world))
        if ops:
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return a, g

    held, grads = {}, [[None] * n_micro for _ in range(v)]

    def F(j, a):
        c, i = fwd_unit(j)
        if stage(c) == 0:
            a = x.chunk(n_micro)[i].detach()
        a.requires_grad_()
        y = forward(a, chunks[c])
        if stage(c) == S - 1:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        held[c, i] = (a, y)
        return None if stage(c) == S - 1 else y.detach()

    def B(j, g):
        c, i = bwd_unit(j)
        a, y = held.pop((c, i))
        y.backward(g if stage(c) != S - 1 else None)
        grads[c][i] = a.grad
        return None if stage(c) == 0 else a.grad

    def needs_input(j):
        return j < total and stage(fwd_unit(j)[0]) != 0

    def needs_grad(j):
        return j < total and stage(bwd_unit(j)[0]) != S - 1

    warmup = min((world - rank - 1) * 2 + (v - 1) * world, total)
    a, _ = p2p(recv_fwd=needs_input(0))
    for j in range(warmup):
        out = F(j, a)
        last_warm = j == warmup - 1 and warmup < total
        a, g = p2p(send_fwd=out, recv_fwd=needs_input(j + 1), recv_bwd=last_warm and needs_grad(0))
    if warmup == total:
        _, g = p2p(recv_bwd=needs_grad(0))
    for k in range(total - warmup):
        out = F(warmup + k, a)
        dx = B(k, g)
        a, g = p2p(send_fwd=out, send_bwd=dx, recv_fwd=needs_input(warmup + k + 1), recv_bwd=needs_grad(k + 1))
    for k in range(total - warmup, total):
        dx = B(k, g)
        _, g = p2p(send_bwd=dx, recv_bwd=needs_grad(k + 1))
    return [torch.cat(gs) for gs in grads]
