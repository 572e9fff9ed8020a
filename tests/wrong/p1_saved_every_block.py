"""p1 mistake: keeping the input of every block (no graph, so the gradients are right), i.e. k = 1 whatever k is."""

import torch

from puzzles.model import block

MISTAKE = "the input of every block is kept (k = 1 whatever k is)"
EXPECTED_FAILURES = {"checkpoint bytes"}
DIAGNOSIS = "you kept every block's input"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for w1, w2 in layers:
            saved.append(x)
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for i in reversed(range(len(layers))):
        start = saved[i].detach().requires_grad_()
        with torch.enable_grad():
            out = block(start, *layers[i])
        out.backward(grad)
        grad = start.grad
    return grad
