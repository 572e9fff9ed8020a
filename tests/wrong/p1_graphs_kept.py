"""p1 mistake: keeping every recomputed segment's graph (retain_graph=True, and the outputs in a list), so by the
last segment all L blocks' activations are alive again: right gradients, checkpointing's memory lost."""

import torch

from puzzles.model import block, forward

MISTAKE = "every recomputed segment's graph is kept alive until the end of the backward"
EXPECTED_FAILURES = {"peak memory"}
DIAGNOSIS = "let its graph and output go"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x)
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad, outputs = grad_y, []
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad, retain_graph=True)
        outputs.append(out)  # keeps the graph, and every activation it saved
        grad = start.grad
    return grad
