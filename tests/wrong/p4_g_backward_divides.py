"""p4 mistake: g's backward divides the gradient by the world size ("the forward summed N partials, so the
backward must share the gradient out"). Every rank already holds the whole dL/dy: g's backward is the identity."""

import torch
import torch.nn.functional as F

MISTAKE = "g's backward divides the gradient by the world size"
EXPECTED_FAILURES = {"input gradient", "weight gradients"}
DIAGNOSIS = "g's backward divided the gradient by the world size"


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
        ctx.world = dist.get_world_size()
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.world, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        a = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)
        x = x + ReduceFromTensorParallel.apply(a @ w2, dist)
    return x
