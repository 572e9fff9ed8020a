"""p1 mistake: recomputing each segment from the stack's input x instead of from its own checkpoint (only the
segment itself is recorded): right gradients and memory, but the recomputation grows with the square of L/k."""

import torch

from puzzles.model import block, forward

MISTAKE = "each segment is recomputed from the stack's input instead of from its own checkpoint"
EXPECTED_FAILURES = {"compute"}
DIAGNOSIS = "recomputed from the stack's input"


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
        with torch.no_grad():
            start = forward(saved[0], layers[:s * k])  # all the way from x again
        start.requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
