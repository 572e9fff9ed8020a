"""p2 cheat: puzzle 1's full checkpoints on every rank, kept as sparse tensors, whose bytes live in their indices
and values rather than in a storage of their own (the ledger once missed them: 0 bytes kept, and p2 passed).
Nothing is gathered: the gather checks fail too."""

import torch

from puzzles.model import block, forward

MISTAKE = "the full checkpoints are kept on every rank, as sparse tensors, to hide them from the ledger"
EXPECTED_FAILURES = {"checkpoint bytes", "peak memory", "gathered checkpoints", "gathered in time"}
DIAGNOSIS = "every rank kept the full checkpoints"


def sharded_forward(dist, x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x.to_sparse())
            x = block(x, w1, w2)
    return saved, x


def sharded_backward(dist, saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = saved[s].to_dense().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
