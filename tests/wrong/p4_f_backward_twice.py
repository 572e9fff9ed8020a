"""p4 mistake: f's backward all-reduces the gradient, and then again ("to be sure every rank agrees"): after the
first all-reduce every rank holds the same sum, so the second multiplies it by N."""

import torch
import torch.nn.functional as F

MISTAKE = "f's backward all-reduces twice"
EXPECTED_FAILURES = {"input gradient", "weight gradients", "backward communication"}
DIAGNOSIS = "f's backward all-reduced twice"


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.dist.all_reduce(grad)
        ctx.dist.all_reduce(grad)
        return grad, None


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
        a = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)
        x = x + ReduceFromTensorParallel.apply(a @ w2, dist)
    return x
