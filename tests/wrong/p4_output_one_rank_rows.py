"""p4 mistake: tp_forward returns only this rank's rows of y, as if the batch were split too (data parallel's
habit), where every rank returns the whole output."""

import torch
import torch.nn.functional as F

MISTAKE = "tp_forward returns this rank's rows of y instead of the whole output"
EXPECTED_STATUS = "error"
DIAGNOSIS = "must return y of shape [32, 64]"


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
        a = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)
        x = x + ReduceFromTensorParallel.apply(a @ w2, dist)
    return x.chunk(dist.get_world_size())[dist.get_rank()]
