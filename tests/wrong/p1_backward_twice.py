"""p1 mistake: backpropagating each segment twice (retain_graph=True, "to be safe"), so every weight's .grad
accumulates its gradient twice, and the backward costs twice as much."""

import torch

from puzzles.model import block, forward

MISTAKE = "each segment is backpropagated twice, so every gradient is accumulated twice"
EXPECTED_FAILURES = {"gradients", "peak memory", "compute"}
DIAGNOSIS = "backpropagated more than once"


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
        out.backward(grad, retain_graph=True)
        start.grad = None
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
