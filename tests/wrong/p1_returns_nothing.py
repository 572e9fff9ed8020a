"""p1 mistake: the backward fills every weight's .grad but returns nothing (the gradient of x is the caller's
business, thinks the learner)."""

import torch

from puzzles.model import block, forward

MISTAKE = "the backward returns None instead of the gradient of x"
EXPECTED_FAILURES = {"gradients"}
DIAGNOSIS = "the backward returned None"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x)
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
