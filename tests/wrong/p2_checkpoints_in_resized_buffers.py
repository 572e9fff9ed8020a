"""p2 cheat: puzzle 1's full checkpoints on every rank, each copied into a buffer made empty and then grown in
place with resize_ (the ledger once charged a storage only for the size it was made with: 0 bytes kept). Nothing is
gathered: the gather checks fail too."""

import torch

from puzzles.model import block, forward

MISTAKE = "the full checkpoints are kept on every rank, in buffers grown by resize_ to hide them from the ledger"
EXPECTED_FAILURES = {"checkpoint bytes", "gathered checkpoints", "gathered in time"}
DIAGNOSIS = "every rank kept the full checkpoints"


def sharded_forward(dist, x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                kept = torch.empty(0, dtype=x.dtype)
                kept.resize_(x.shape)
                saved.append(kept.copy_(x))
            x = block(x, w1, w2)
    return saved, x


def sharded_backward(dist, saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
