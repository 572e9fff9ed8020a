"""p2 cheat: puzzle 1's full checkpoints on every rank, but kept as Python lists of numbers, which the memory
ledger cannot see; the backward turns them back into tensors."""

import torch

from puzzles.model import block, forward

MISTAKE = "the full checkpoints are kept as Python lists, out of the ledger's sight"
EXPECTED_STATUS = "error"
DIAGNOSIS = "HiddenMemoryError"


def sharded_forward(dist, x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x.tolist())
            x = block(x, w1, w2)
    return saved, x


def sharded_backward(dist, saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = torch.tensor(saved[s], dtype=torch.float64, requires_grad=True)
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
