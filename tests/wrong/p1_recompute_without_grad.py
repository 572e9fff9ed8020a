"""p1 mistake: recomputing the segments under torch.no_grad() too (copied from the forward), so there is no graph
to backpropagate through: autograd raises, and the grader says why."""

import torch

from puzzles.model import block, forward

MISTAKE = "the segments are recomputed under torch.no_grad(), so there is no graph to backpropagate through"
EXPECTED_STATUS = "error"
DIAGNOSIS = "was recomputed without a graph"


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
        with torch.no_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
    return grad
