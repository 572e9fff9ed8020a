"""p1 mistake: each segment is recomputed twice, once without a graph "to see its output" and once with it to
backpropagate: right gradients and memory, but two extra forwards instead of one."""

import torch

from puzzles.model import block, forward

MISTAKE = "each segment is recomputed twice (once without a graph, once with)"
EXPECTED_FAILURES = {"compute"}
DIAGNOSIS = "you ran 32 blocks' forwards"


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
            forward(saved[s], layers[s * k:(s + 1) * k])  # a look at the output first: wasted
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
