"""p1 mistake: the forward's loop stops one block short (range(len(layers) - 1)), so y is the last block's input,
and the backward, which recomputes the segments as they should be, backpropagates a wrong grad_y."""

import torch

from puzzles.model import block, forward

MISTAKE = "the forward runs one block fewer than the stack has"
EXPECTED_FAILURES = {"output", "gradients"}
DIAGNOSIS = "the forward ran blocks 0 to 14 only"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for i in range(len(layers) - 1):
            if i % k == 0:
                saved.append(x)
            x = block(x, *layers[i])
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
    return grad
