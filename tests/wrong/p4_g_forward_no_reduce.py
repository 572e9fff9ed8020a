"""p4 mistake: g's forward forgets the all-reduce, so each rank carries on with its own partial sum a_r @ w2_r
(and the ranks drift apart from the first block on)."""

import torch
import torch.nn.functional as F

MISTAKE = "g's forward does not all-reduce the partial outputs"
EXPECTED_FAILURES = {"output", "input gradient", "weight gradients"}
DIAGNOSIS = "g's forward must all-reduce"


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
        return partial.clone()  # the mistake: the partial outputs are never summed

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        x = x + ReduceFromTensorParallel.apply(F.gelu(CopyToTensorParallel.apply(x, dist) @ w1) @ w2, dist)
    return x
