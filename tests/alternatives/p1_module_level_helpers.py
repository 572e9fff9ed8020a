"""p1, another style: module-level helpers for a segment's bounds and its recomputation, and the checkpoints kept
as (index, tensor) pairs."""

import torch

from puzzles.model import block, forward


def segment_layers(layers, start, k):
    return layers[start:start + k]


def recompute_and_backprop(checkpoint, segment, grad_out):
    """Recompute one segment from its checkpoint with autograd on, backpropagate grad_out, return the input's grad."""
    start = checkpoint.detach().requires_grad_()
    with torch.enable_grad():
        out = forward(start, segment)
    out.backward(grad_out)
    return start.grad


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append((i, x))
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    while saved:
        i, checkpoint = saved.pop()
        grad = recompute_and_backprop(checkpoint, segment_layers(layers, i, k), grad)
    return grad
