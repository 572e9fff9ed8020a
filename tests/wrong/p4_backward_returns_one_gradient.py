"""p4 mistake: a backward that returns one gradient for a forward that took two inputs (x and dist): torch
refuses it, and the error must reach the learner with the line."""

import torch
import torch.nn.functional as F

MISTAKE = "a backward returns one gradient for a forward of two inputs"
EXPECTED_STATUS = "error"
DIAGNOSIS = "incorrect number of gradients"


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.dist.all_reduce(grad)
        return grad  # the mistake: forward took (x, dist), so backward must return (grad, None)


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        x = x + ReduceFromTensorParallel.apply(F.gelu(CopyToTensorParallel.apply(x, dist) @ w1) @ w2, dist)
    return x
