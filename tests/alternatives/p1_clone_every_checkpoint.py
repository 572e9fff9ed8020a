"""p1, another style: every checkpoint is a clone (x's too), kept in a dict keyed by the block index, and the
backward walks the dict's keys in reverse. One C more than the reference (x cloned), within the budget."""

import torch

from puzzles.model import block, forward


def checkpointed_forward(x, layers, k):
    saved = {}
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved[i] = x.clone()
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for i in sorted(saved, reverse=True):
        start = saved.pop(i).requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[i:i + k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
