"""p4 mistake: the backward all-reduce put in g instead of f ("g is the one that all-reduces"): f is the identity
both ways and g all-reduces both ways. One all-reduce per block each way, so only the gradients give it away."""

import torch
import torch.nn.functional as F

MISTAKE = "the backward all-reduce is in g instead of f"
EXPECTED_FAILURES = {"input gradient", "weight gradients"}
DIAGNOSIS = "the backward all-reduce is in g instead of f"


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None  # the mistake, half 1: f's backward should all-reduce


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
        ctx.dist.all_reduce(grad)  # the mistake, half 2: g's backward should be the identity
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        x = x + ReduceFromTensorParallel.apply(F.gelu(CopyToTensorParallel.apply(x, dist) @ w1) @ w2, dist)
    return x
