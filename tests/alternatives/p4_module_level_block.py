"""p4, another style: the block as a module-level helper, the operators' communication in one module-level
function, and f's forward returning a view of x rather than x itself."""

import torch
import torch.nn.functional as F


def sum_over_ranks(dist, t):
    total = t.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return sum_over_ranks(ctx.dist, grad), None


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        return sum_over_ranks(dist, partial)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def parallel_block(dist, x, w1, w2):
    hidden = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)  # [B, h/N]
    return x + ReduceFromTensorParallel.apply(hidden @ w2, dist)  # [B, d]


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        x = parallel_block(dist, x, w1, w2)
    return x
