"""p17 mistake: when a microbatch's gradient arrives, its weight gradients are computed first and its input
gradient after: the rank before it waits for W on every microbatch, the whole backward on the critical path again."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "W computed before B for each microbatch (the input gradient waits behind the weight gradients)"
EXPECTED_FAILURES = {"bubble", "B before W"}
DIAGNOSIS = "before sending input gradient number"


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    weights = [w for pair in layers for w in pair]
    held = {}  # microbatch -> (its stage input, its stage output): forwarded, not yet backwarded
    activation_sends = {}
    gradient_sends = []
    input_grads = [None] * n_micro

    def run_forward(i):
        with torch.profiler.record_function(f"F{i}"):
            if first:
                a = x.chunk(n_micro)[i].detach()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(a, src=rank - 1)
            a.requires_grad_()
            y = forward(a, layers)
            if last:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                activation_sends[i] = dist.isend(y.detach(), rank + 1)
        held[i] = (a, y)

    def run_b(i):
        a, y = held[i]
        with torch.profiler.record_function(f"B{i}"):
            g = None
            if not last:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, src=rank + 1)
                activation_sends.pop(i).wait()  # its gradient is back: the next rank had the activation
            y.backward(g, inputs=weights, retain_graph=True)  # the weight gradients first
            (dx,) = torch.autograd.grad(y, a, g)
            if not first:
                gradient_sends.append(dist.isend(dx, rank - 1))
        input_grads[i] = dx
        held.pop(i)

    warmup = min(world - 1 - rank, n_micro)
    for i in range(warmup):
        run_forward(i)
    backwards = 0
    for i in range(warmup, n_micro):  # steady state: a forward, then W and B of the oldest
        run_forward(i)
        run_b(backwards)
        backwards += 1
    while backwards < n_micro:  # cool-down
        run_b(backwards)
        backwards += 1
    for work in gradient_sends:
        work.wait()
    return torch.cat(input_grads)
