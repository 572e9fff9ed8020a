"""p4 mistake: the residual added before g ("one all-reduce for the whole block"): g's forward sums x + branch
over the ranks, so every block's output holds x N times. f and g are right otherwise; the communication is right
too, so only the values give it away."""

import torch
import torch.nn.functional as F

MISTAKE = "the residual is added inside g, so the all-reduce sums the ranks' copies of x too"
EXPECTED_FAILURES = {"output", "input gradient", "weight gradients"}
DIAGNOSIS = "the residual went into g"


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
    for w1, w2 in shards:
        branch = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1) @ w2
        x = ReduceFromTensorParallel.apply(x + branch, dist)  # the mistake: x = x + g(branch)
    return x
