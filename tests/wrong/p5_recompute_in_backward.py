"""p5 mistake (of a kind): a GPipe that keeps only each microbatch's stage input and recomputes the stage's
forward in backward, puzzle 1's trick. The gradients are right and the memory is low, but every stage computes
each forward twice, which the puzzle does not allow (and the step takes longer)."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "each stage recomputes its forward in backward (activation checkpointing), computing every forward twice"
EXPECTED_FAILURES = {"stage compute", "bubble"}
DIAGNOSIS = "recomputation"


def gpipe_step(dist, layers, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    inputs = []
    for i in range(n_micro):
        if first:
            a = x.chunk(n_micro)[i].detach()
        else:
            a = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(a, src=rank - 1)
        with torch.no_grad():
            y = forward(a, layers)
        if not last:
            dist.send(y, dst=rank + 1)
        inputs.append(a)
    input_grads = [None] * n_micro
    for i in reversed(range(n_micro)):
        a = inputs[i].requires_grad_()
        y = forward(a, layers)  # the forward again, with its graph
        if last:
            (loss_fn(y, target.chunk(n_micro)[i]) / n_micro).backward()
        else:
            g = torch.empty(micro_shape, dtype=torch.float64)
            dist.recv(g, src=rank + 1)
            y.backward(g)
        input_grads[i] = a.grad
        if not first:
            dist.send(a.grad, dst=rank - 1)
    return torch.cat(input_grads)
