"""p16, another style: no warm-up arithmetic in the loop. A rank runs its next forward while it holds fewer chunk
activations than the interleaved order allows it ((p - r - 1)·2 + (v - 1)·p + 1) and has forwards left, else its
next backward; the forwards and backwards come off two queues built in the group order. Plain recv and isend."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn


def interleaved_step(dist, chunks, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    groups = [range(g, min(g + world, n_micro)) for g in range(0, n_micro, world)]
    forwards = deque((c, i) for group in groups for c in range(v) for i in group)
    backwards = deque((c, i) for group in groups for c in reversed(range(v)) for i in group)
    allowed = min((world - rank - 1) * 2 + (v - 1) * world + 1, n_micro * v)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    saved, sent, grad_sends = {}, {}, []
    result = [[None] * n_micro for _ in range(v)]
    rows = micro_shape[0]
    while backwards:
        if forwards and len(saved) < allowed:
            c, i = forwards.popleft()
            s = c * world + rank
            if s == 0:
                a = x[i * rows:(i + 1) * rows].detach()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(a, prv)
            a.requires_grad_()
            out = forward(a, chunks[c])
            if s == v * world - 1:
                out = loss_fn(out, target[i * rows:(i + 1) * rows]) / n_micro
            else:
                sent[c, i] = dist.isend(out.detach(), nxt)
            saved[c, i] = (a, out)
        else:
            c, i = backwards.popleft()
            s = c * world + rank
            a, out = saved.pop((c, i))
            if s == v * world - 1:
                out.backward()
            else:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, nxt)
                sent.pop((c, i)).wait()
                out.backward(g)
            result[c][i] = a.grad
            if s > 0:
                grad_sends.append(dist.isend(a.grad, prv))
    for work in grad_sends:
        work.wait()
    return [torch.cat(grads) for grads in result]
