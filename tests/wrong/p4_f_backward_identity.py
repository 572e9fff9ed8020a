"""p4 mistake: f is the identity both ways, so each rank's x.grad keeps only its own share of the branch's
input gradient (its w1_r sees only its columns)."""

import torch
import torch.nn.functional as F

MISTAKE = "f's backward is the identity (no all-reduce of the input gradient)"
EXPECTED_FAILURES = {"input gradient", "weight gradients"}
DIAGNOSIS = "f's backward must all-reduce"


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None  # the mistake: the partial input gradients are never summed


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
