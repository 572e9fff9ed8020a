"""p17, another style: no autograd at all. The forward keeps (x, h, gelu(h)) per block; B computes the input
gradient by hand and stores each block's (x, gelu(h), dh, g); W is then the two weight-gradient products alone,
added into w.grad. Every FLOP runs outside autograd's backward: the B before W check reads it off all the compute
less the forwards'. The schedule by counters, ZB-H1's."""

from collections import deque

import torch
import torch.nn.functional as F


def _fwd(a, layers):
    saved = []
    for w1, w2 in layers:
        h = a @ w1
        gh = F.gelu(h)
        out = a + gh @ w2
        saved.append((a, h, gh))
        a = out
    return a, saved


def _bwd_input(g, layers, saved):
    store = []
    for (w1, w2), (a, h, gh) in zip(reversed(layers), reversed(saved)):
        dgh = g @ w2.t()
        dh = torch.ops.aten.gelu_backward(dgh, h)
        store.append((a, gh, dh, g))
        g = g + dh @ w1.t()
    return g, store[::-1]


def _bwd_weights(layers, store):
    for (w1, w2), (a, gh, dh, g) in zip(layers, store):
        w2.grad.addmm_(gh.t(), g)
        w1.grad.addmm_(a.t(), dh)


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    rank, p = dist.get_rank(), dist.get_world_size()
    last = rank == p - 1
    with torch.no_grad():
        fwd_q, w_q = deque(), deque()
        dxs, pend_act, pend_grad = [], [], []
        nf = 0

        def do_f():
            nonlocal nf
            i = nf
            with torch.profiler.record_function(f"F{i}"):
                if rank == 0:
                    a = x.chunk(n_micro)[i]
                else:
                    a = torch.empty(micro_shape, dtype=torch.float64)
                    dist.recv(a, rank - 1)
                y, saved = _fwd(a, layers)
                if last:
                    t = target.chunk(n_micro)[i]
                    g_out = (y - t) * (2.0 / (t.shape[0] * n_micro))
                    del y
                    fwd_q.append((i, saved, g_out))
                else:
                    pend_act.append(dist.isend(y, rank + 1))
                    fwd_q.append((i, saved, None))
            nf += 1

        def do_b():
            i, saved, g = fwd_q.popleft()
            with torch.profiler.record_function(f"B{i}"):
                if g is None:
                    g = torch.empty(micro_shape, dtype=torch.float64)
                    dist.recv(g, rank + 1)
                dx, store = _bwd_input(g, layers, saved)
                del saved
                if rank > 0:
                    pend_grad.append(dist.isend(dx, rank - 1))
                dxs.append(dx)
                w_q.append((i, store))

        def do_w():
            i, store = w_q.popleft()
            with torch.profiler.record_function(f"W{i}"):
                _bwd_weights(layers, store)

        for _ in range(min(p - 1 - rank, n_micro)):
            do_f()
        nb = 0
        while nb < n_micro:
            if nf < n_micro:
                do_f()
            do_b(); nb += 1
            while len(w_q) > rank:
                do_w()
        while w_q:
            do_w()
        for h in pend_act + pend_grad:
            h.wait()
        return torch.cat(dxs)
