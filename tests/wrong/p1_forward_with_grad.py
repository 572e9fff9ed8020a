"""p1 mistake: the forward keeps only the checkpoints, but runs with autograd on, so each checkpoint carries a
grad_fn that keeps the whole graph behind it alive until the backward. The backward itself is right."""

import torch

from puzzles.model import block, forward

MISTAKE = "the forward runs with autograd on, so the checkpoints keep the whole graph alive"
EXPECTED_FAILURES = {"checkpoint bytes", "peak memory"}
DIAGNOSIS = "Run it under torch.no_grad()"


def checkpointed_forward(x, layers, k):
    saved = []
    for i, (w1, w2) in enumerate(layers):  # no torch.no_grad(): every block is recorded
        if i % k == 0:
            saved.append(x)
        x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
