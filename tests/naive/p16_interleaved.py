"""Naive p16: every forward first, then every backward (GPipe over the chunks, "breadth-first"): each rank runs
all m microbatches through chunk 0, then all through chunk 1, then the backwards in reverse. The gradients and
the bubble are the interleaved schedule's (the same p-1 slots of one chunk's work), but every rank holds all
m·v = 16 chunk activations before its first backward, where the interleaved order holds at most 11."""

import torch

from puzzles.model import forward, loss_fn

EXPECTED_FAILURES = {"activation memory"}
DIAGNOSIS = "GPipe over the chunks"


def interleaved_step(dist, chunks, x, target, n_micro, micro_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    last_stage = v * world - 1
    held, activation_sends, gradient_sends = {}, {}, []
    input_grads = [[None] * n_micro for _ in range(v)]
    for c in range(v):  # all forwards: chunk 0 for every microbatch, then chunk 1
        for i in range(n_micro):
            stage = c * world + rank
            if stage == 0:
                a = x.chunk(n_micro)[i].detach()
            else:
                a = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(a, src=(rank - 1) % world)
            a.requires_grad_()
            y = forward(a, chunks[c])
            if stage == last_stage:
                y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro
            else:
                activation_sends[c, i] = dist.isend(y.detach(), (rank + 1) % world)
            held[c, i] = (a, y)
    for c in reversed(range(v)):  # all backwards: chunk 1 first, every microbatch in the same order on every rank
        for i in range(n_micro):
            stage = c * world + rank
            a, y = held.pop((c, i))
            if stage == last_stage:
                y.backward()
            else:
                g = torch.empty(micro_shape, dtype=torch.float64)
                dist.recv(g, src=(rank + 1) % world)
                activation_sends.pop((c, i)).wait()
                y.backward(g)
            if stage > 0:
                gradient_sends.append(dist.isend(a.grad, (rank - 1) % world))
            input_grads[c][i] = a.grad
    for work in gradient_sends:
        work.wait()
    return [torch.cat(grads) for grads in input_grads]
