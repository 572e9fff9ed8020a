"""p1 mistake: keeping the output of blocks k-1, 2k-1, ... (after the block instead of before it), so each segment
is recomputed from one block too far on: every gradient is off, the last segment's too."""

import torch

from puzzles.model import block, forward

MISTAKE = "the checkpoints are the outputs of blocks k-1, 2k-1, ... instead of the inputs of blocks 0, k, 2k, ..."
EXPECTED_FAILURES = {"gradients"}
DIAGNOSIS = "start from the input of block s·k"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            x = block(x, w1, w2)
            if i % k == k - 1:
                saved.append(x)  # the output of the segment's last block, not the input of its first
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del start, out
    return grad
