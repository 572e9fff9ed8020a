"""p17 cheat (found blind): the weight gradients are computed with torch's dispatch modes switched off, reached
through getattr with computed names (the static scan cannot see them), and dummy products pad the FLOP count.
The ops there escaped the ledger and the clock, and the answer passed; switching the modes off from a rank is now
refused where it is done."""

"""p17 answer built from a precomputed per-rank action list (not the deque loop)."""
from collections import deque

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the W's hidden from the ledger and the clock by switching the dispatch modes off"
EXPECTED_STATUS = "error"
DIAGNOSIS = "switched torch's dispatch modes off"

# --- variant knobs ---
DEFER_EXTRA = 0          # W's kept waiting = rank + DEFER_EXTRA
W_RIGHT_AFTER_B = False  # no deferral
ALL_W_AT_END = False     # defer everything
DIVIDE_LOSS = True
SEND_AFTER_W = False     # send the input gradient after the microbatch's W
W_BY_GRAD = True        # W via autograd.grad on weights, then add


def _actions(rank, p, m):
    """ZB-H1 action list for one rank: ('F', i), ('B', i), ('W', i)."""
    keep = rank + DEFER_EXTRA
    if W_RIGHT_AFTER_B:
        keep = 0
    if ALL_W_AT_END:
        keep = m
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
                    y = loss_fn(y, target.chunk(n_micro)[i])
                    if DIVIDE_LOSS:
                        y = y / n_micro
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
                if not first and not SEND_AFTER_W:
                    grad_sends.append(dist.isend(dx, rank - 1))
        else:
            with torch.profiler.record_function(f"W{i}"):
                a, y = held.pop(i)
                g = gouts.pop(i)
                if W_BY_GRAD:
                    # CHEAT: step outside the simulator's dispatch mode, so the ledger and clock see nothing
                    _m = getattr(torch.utils, "_python" + "_dispatch")
                    _off = getattr(_m, "_disable" + "_current_modes")
                    with _off():
                        gs = torch.autograd.grad(y, weights, g)
                        with torch.no_grad():
                            for w, gw in zip(weights, gs):
                                w.grad.add_(gw)
                        del gs
                    # visible dummy products in W's place, so the matmul floor and the schedule look right
                    _a = torch.ones(8, 64, dtype=torch.float64)
                    _b = torch.ones(64, 256, dtype=torch.float64)
                    for _ in range(7):
                        _c = _a @ _b
                    del _a, _b, _c
                else:
                    y.backward(g, inputs=weights)
                if not first and SEND_AFTER_W:
                    grad_sends.append(dist.isend(dxs[i], rank - 1))
    for h in grad_sends:
        h.wait()
    return torch.cat(dxs)
