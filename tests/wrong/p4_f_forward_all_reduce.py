"""p4 mistake: f all-reduces in forward as well as backward (all-reduce in both f and g forward). Every rank
already holds the whole x, so the sum feeds N·x into every block."""

import torch
import torch.nn.functional as F

MISTAKE = "f all-reduces in forward as well as in backward"
EXPECTED_FAILURES = {"output", "input gradient", "weight gradients", "forward communication"}
DIAGNOSIS = "all-reduce in both f and g?"


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        x = x.clone()
        dist.all_reduce(x)  # the mistake: f's forward is the identity
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
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        x = x + ReduceFromTensorParallel.apply(F.gelu(CopyToTensorParallel.apply(x, dist) @ w1) @ w2, dist)
    return x
