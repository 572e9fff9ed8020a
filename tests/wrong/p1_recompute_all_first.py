"""p1 mistake: the checkpoints are right, but the backward recomputes every segment (with its graph) before
backpropagating through any of them, so all L blocks' activations are alive at once again."""

import torch

from puzzles.model import block, forward

MISTAKE = "the backward recomputes every segment before backpropagating through any of them"
EXPECTED_FAILURES = {"peak memory"}
DIAGNOSIS = "recompute one segment at a time"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x)
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    segments = []
    with torch.enable_grad():
        for s, c in enumerate(saved):
            start = c.detach().requires_grad_()
            segments.append((start, forward(start, layers[s * k:(s + 1) * k])))
    grad = grad_y
    for start, out in reversed(segments):
        out.backward(grad)
        grad = start.grad
    return grad
