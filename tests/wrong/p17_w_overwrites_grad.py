"""p17 mistake: W by torch.autograd.grad, one weight at a time, assigned to w.grad instead of added: each weight
keeps the last microbatch's contribution only."""

from collections import deque

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "W's gradients assigned to w.grad, not added (one microbatch's contribution left)"
EXPECTED_FAILURES = {"stage gradients", "stage compute", "bubble"}
DIAGNOSIS = "contribution only"


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    weights = [w for pair in layers for w in pair]
    held = {}  # microbatch -> (its stage input, its stage output): forwarded, its W not done yet
    waiting = deque()  # (microbatch, its output gradient): B done, W deferred
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
            (dx,) = torch.autograd.grad(y, a, g, retain_graph=True)  # the input gradient alone
            if not first:
                gradient_sends.append(dist.isend(dx, rank - 1))
        input_grads[i] = dx
        waiting.append((i, g))

    def run_w():
        i, g = waiting.popleft()
        a, y = held.pop(i)
        with torch.profiler.record_function(f"W{i}"):
            for k, w in enumerate(weights):
                (w.grad,) = torch.autograd.grad(y, w, g, retain_graph=k < len(weights) - 1)

    warmup = min(world - 1 - rank, n_micro)
    for i in range(warmup):
        run_forward(i)
    backwards = 0
    for i in range(warmup, n_micro):  # steady state: a forward, a B, and a W once more than `rank` wait
        run_forward(i)
        run_b(backwards)
        backwards += 1
        if len(waiting) > rank:
            run_w()
    while backwards < n_micro:  # cool-down: the B's left over, a W after each while more than `rank` wait
        run_b(backwards)
        backwards += 1
        if len(waiting) > rank:
            run_w()
    while waiting:  # the deferred W's, in what was 1F1B's bubble
        run_w()
    for work in gradient_sends:
        work.wait()
    return torch.cat(input_grads)
