"""p4 mistake: g all-reduces in backward too ("an all-reduce's backward is an all-reduce"). Every rank already
holds the whole dL/dy, so the sum makes the gradient through every branch N times too large."""

import torch
import torch.nn.functional as F

MISTAKE = "g all-reduces in backward too"
EXPECTED_FAILURES = {"input gradient", "weight gradients", "backward communication"}
DIAGNOSIS = "g's backward all-reduces too"


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.dist.all_reduce(grad)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        ctx.dist = dist
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.dist.all_reduce(grad)  # the mistake: g's backward is the identity
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        x = x + ReduceFromTensorParallel.apply(F.gelu(CopyToTensorParallel.apply(x, dist) @ w1) @ w2, dist)
    return x
