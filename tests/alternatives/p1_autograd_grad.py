"""p1, another style: the backward takes each segment's gradients with torch.autograd.grad and adds the weights'
into their .grad itself, instead of calling backward()."""

import torch

from puzzles.model import block, forward


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
        segment = layers[s * k:(s + 1) * k]
        weights = [w for pair in segment for w in pair]
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad():
            out = forward(start, segment)
        grads = torch.autograd.grad(out, [start, *weights], grad)
        del out
        for w, g in zip(weights, grads[1:]):
            if w.grad is None:
                w.grad = g
            else:
                w.grad += g
        grad = grads[0]
        del grads
    return grad
