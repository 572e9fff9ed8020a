"""p4 mistake: f and g used the wrong way round: g (all-reduce forward) before w1 and f (identity forward) after
w2. Still one all-reduce per block each way, so only the values give it away."""

import torch
import torch.nn.functional as F

MISTAKE = "f and g are used the wrong way round"
EXPECTED_FAILURES = {"output", "input gradient", "weight gradients"}
DIAGNOSIS = "f and g are swapped"


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
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    f, g = CopyToTensorParallel.apply, ReduceFromTensorParallel.apply
    for w1, w2 in shards:
        x = x + f(F.gelu(g(x, dist) @ w1) @ w2, dist)  # the mistake: g first, f last
    return x
