"""p17 mistake, in another style (a per-rank list of actions, not a deque loop): every W deferred past the last B.
The order is split and the input gradients leave at once, but the W's all run after the cool-down, where they fill
no gap: the cool-down's gaps stay as empty as with no W deferred, and every microbatch's activations stay held."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "every W kept waiting until after the last B, none run in the cool-down's gaps"
EXPECTED_FAILURES = {"bubble", "activation memory"}
DIAGNOSIS = "every W ran after the last B"


def _actions(rank, p, m):
    """ZB-H1 action list for one rank: ('F', i), ('B', i), ('W', i)."""
    keep = m  # the mistake: ZB-H1 keeps `rank` waiting
    acts, pending = [], []
    nf = nb = 0
    warm = min(p - 1 - rank, m)
    for _ in range(warm):
        acts.append(("F", nf)); nf += 1
    while nb < m:
        if nf < m:
            acts.append(("F", nf)); nf += 1
        acts.append(("B", nb)); pending.append(nb); nb += 1
        if len(pending) > keep:
            acts.append(("W", pending.pop(0)))
    acts.extend(("W", i) for i in pending)
    return acts


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    rank, p = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == p - 1
    weights = [w for pair in layers for w in pair]
    held = {}          # i -> (a, y)
    gouts = {}         # i -> output gradient
    dxs = [None] * n_micro
    act_sends, grad_sends = {}, []
    for kind, i in _actions(rank, p, n_micro):
        if kind == "F":
            with torch.profiler.record_function(f"F{i}"):
                if first:
                    a = x.chunk(n_micro)[i].detach().requires_grad_()
                else:
                    a = torch.empty(micro_shape, dtype=torch.float64)
                    dist.recv(a, rank - 1)
                    a.requires_grad_()
                y = forward(a, layers)
                if last:
                    y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
                else:
                    act_sends[i] = dist.isend(y.detach(), rank + 1)
                held[i] = (a, y)
        elif kind == "B":
            with torch.profiler.record_function(f"B{i}"):
                a, y = held[i]
                if last:
                    g = None
                else:
                    g = torch.empty(micro_shape, dtype=torch.float64)
                    dist.recv(g, rank + 1)
                    act_sends.pop(i).wait()
                gouts[i] = g
                (dx,) = torch.autograd.grad(y, a, g, retain_graph=True)
                dxs[i] = dx
                if not first:
                    grad_sends.append(dist.isend(dx, rank - 1))
        else:
            with torch.profiler.record_function(f"W{i}"):
                a, y = held.pop(i)
                g = gouts.pop(i)
                y.backward(g, inputs=weights)
    for h in grad_sends:
        h.wait()
    return torch.cat(dxs)
