"""p1 cheat: reloading torch.utils.checkpoint to get back what the puzzle takes away, then calling it."""

import importlib

import torch
import torch.utils.checkpoint

from puzzles.model import forward

MISTAKE = "torch.utils.checkpoint is reloaded to undo the grader's switch-off, then used"
EXPECTED_STATUS = "tampered"
DIAGNOSIS = "imports importlib"


def checkpointed_forward(x, layers, k):
    checkpoint = importlib.reload(torch.utils.checkpoint).checkpoint
    x0 = x.detach().requires_grad_()
    h = x0
    for s in range(0, len(layers), k):
        h = checkpoint(forward, h, layers[s:s + k], use_reentrant=False)
    return (x0, h), h.detach()


def checkpointed_backward(saved, layers, k, grad_y):
    x0, y = saved
    y.backward(grad_y)
    return x0.grad
