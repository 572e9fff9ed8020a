"""p1 mistake: backpropagating grad_y into every segment, instead of the gradient of that segment's own output
(the .grad of the next segment's recomputed input). Only the last segment's gradients come out right."""

import torch

from puzzles.model import block, forward

MISTAKE = "grad_y is backpropagated into every segment instead of the gradient of that segment's output"
EXPECTED_FAILURES = {"gradients"}
DIAGNOSIS = "every segment was backpropagated from grad_y"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x)
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad_x = None
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad_y)  # should be the gradient handed back by the segment after this one
        grad_x = start.grad
        del start, out
    return grad_x
