"""p4 mistake: g averages the partial outputs (ReduceOp.AVG, the habit from data parallel) instead of summing
them: the MLP branch comes out N times too small."""

import torch
import torch.nn.functional as F

MISTAKE = "g's forward averages the partial outputs instead of summing them"
EXPECTED_FAILURES = {"output", "input gradient", "weight gradients"}
DIAGNOSIS = "g's forward averaged the partial outputs"


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
        total = partial.clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # the mistake: the partials are pieces of one sum
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        x = x + ReduceFromTensorParallel.apply(F.gelu(CopyToTensorParallel.apply(x, dist) @ w1) @ w2, dist)
    return x
