"""p1 mistake: returning (y, saved) instead of (saved, y): the grader gets a list where it expects the output."""

import torch

from puzzles.model import block, forward

MISTAKE = "the forward returns (y, saved) instead of (saved, y)"
EXPECTED_STATUS = "error"
DIAGNOSIS = "must return y, the stack's output"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x)
            x = block(x, w1, w2)
    return x, saved


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
    return grad
