"""p17, another style: the split as Megatron-LM's zero-bubble code does it (a WeightGradStore). Each block is
written out so that its pieces can be named; B asks autograd for the gradients at the stage input and at each
block's pre-activation and output, and frees the graph; W is then the weight-gradient products alone, computed by
hand from what B left (w2 += h^T @ dy, w1 += x^T @ dz): B + W = BW, nothing walked twice. Same ZB-H1 order."""

from collections import deque

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    store = deque()  # per microbatch B has run and W has not: [(x_k, h_k, dz_k, dy_k) for each block]
    kept, out_sends, grad_sends, dxs = {}, {}, [], [None] * n_micro

    def forward_stage(a):
        pieces, out = [], a
        for w1, w2 in layers:
            z = out @ w1
            h = F.gelu(z)
            nxt = out + h @ w2
            pieces.append((out, z, h, nxt))
            out = nxt
        return out, pieces

    def f(i):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        a.requires_grad_()
        y, pieces = forward_stage(a)
        if last:
            y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
        else:
            out_sends[i] = dist.isend(y.detach(), rank + 1)
        kept[i] = (a, y, pieces)

    def b(i):
        a, y, pieces = kept.pop(i)
        g = None
        if not last:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            out_sends.pop(i).wait()
        wanted = [a] + [t for _, z, _, out in pieces for t in (z, out)]
        grads = torch.autograd.grad(y, wanted, g)  # the input path only: no weight is asked for
        dx = grads[0]
        if not first:
            grad_sends.append(dist.isend(dx, rank - 1))
        dxs[i] = dx
        store.append([(xk.detach(), h.detach(), grads[1 + 2 * k], grads[2 + 2 * k])
                      for k, (xk, _, h, _) in enumerate(pieces)])

    def w():
        with torch.no_grad():
            for (w1, w2), (xk, h, dz, dy) in zip(layers, store.popleft()):
                w2.grad.addmm_(h.t(), dy)
                w1.grad.addmm_(xk.t(), dz)

    warmup = min(world - 1 - rank, n_micro)
    for i in range(warmup):
        f(i)
    done = 0
    for i in range(warmup, n_micro):
        f(i)
        b(done)
        done += 1
        if len(store) > rank:
            w()
    while done < n_micro:
        b(done)
        done += 1
        if len(store) > rank:
            w()
    while store:
        w()
    for work in grad_sends:
        work.wait()
    return torch.cat(dxs)
