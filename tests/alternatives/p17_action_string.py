"""p17, another style: each rank's ZB-H1 order spelled out first as a string ("FFFBFBW..."), then played; B as
y.backward(g, inputs=[a], retain_graph=True) (the input gradient lands in a.grad), W as
torch.autograd.backward(y, g, inputs=weights); receives posted with irecv right where they are needed."""

import torch

from puzzles.model import forward, loss_fn


def zb_h1_order(rank, world, n_micro):
    """'F', 'B' and 'W' in the order `rank` runs them: 1F1B's warm-up and steady state with B for the backward,
    r W's kept waiting on rank r, the rest at the end."""
    warmup = min(world - 1 - rank, n_micro)
    order, waiting = "F" * warmup, 0
    for step in range(n_micro):
        order += ("F" if warmup + step < n_micro else "") + "B"
        waiting += 1
        if waiting > rank:
            order, waiting = order + "W", waiting - 1
    return order + "W" * waiting


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    counters = {"F": 0, "B": 0, "W": 0}
    graphs, grads_for_w, results, handles, out_handles = {}, {}, [], [], {}
    for op in zb_h1_order(rank, world, n_micro):
        i = counters[op]
        counters[op] += 1
        if op == "F":
            if rank == 0:
                a = x.chunk(n_micro)[i].detach()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.irecv(a, rank - 1).wait()
            a.requires_grad_()
            y = forward(a, layers)
            if rank == world - 1:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                out_handles[i] = dist.isend(y.detach(), rank + 1)
            graphs[i] = (a, y)
        elif op == "B":
            a, y = graphs[i]
            g = None
            if rank != world - 1:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.irecv(g, rank + 1).wait()
                out_handles.pop(i).wait()
            y.backward(g, inputs=[a], retain_graph=True)
            if rank != 0:
                handles.append(dist.isend(a.grad, rank - 1))
            results.append(a.grad)
            grads_for_w[i] = g
        else:
            a, y = graphs.pop(i)
            torch.autograd.backward(y, grads_for_w.pop(i), inputs=weights)
    for h in handles:
        h.wait()
    return torch.cat(results)
