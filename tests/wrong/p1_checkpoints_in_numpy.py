"""p1 cheat: the naive forward's activations are all kept, but as numpy arrays, which the memory ledger cannot
see; the backward rebuilds tensors from them. Only a guard against memory kept outside torch catches it."""

import torch

from puzzles.model import block

MISTAKE = "every block's input is kept as a numpy array, out of the ledger's sight"
EXPECTED_STATUS = "error"
DIAGNOSIS = "HiddenMemoryError"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for w1, w2 in layers:
            saved.append(x.numpy().copy())
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for i in reversed(range(len(layers))):
        start = torch.from_numpy(saved[i]).requires_grad_()
        with torch.enable_grad():
            out = block(start, *layers[i])
        out.backward(grad)
        grad = start.grad
    return grad
