"""p1 mistake (of a kind): calling torch.utils.checkpoint instead of writing it. The grader switches it off and
says why."""

import torch
import torch.utils.checkpoint

from puzzles.model import forward

MISTAKE = "torch.utils.checkpoint is called instead of writing checkpointing"
EXPECTED_STATUS = "error"
DIAGNOSIS = "the puzzle is to write activation checkpointing by hand"


def checkpointed_forward(x, layers, k):
    x0 = x.detach().requires_grad_()
    h = x0
    for s in range(0, len(layers), k):
        h = torch.utils.checkpoint.checkpoint(forward, h, layers[s:s + k], use_reentrant=False)
    return (x0, h), h.detach()


def checkpointed_backward(saved, layers, k, grad_y):
    x0, y = saved
    y.backward(grad_y)
    return x0.grad
