"""p4, another style: g's forward sums the partial outputs as a reduce-scatter followed by an all-gather (the two
halves of an all-reduce, the same bytes; sequence parallelism starts from here)."""

import torch
import torch.nn.functional as F


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
        world = dist.get_world_size()
        rows = torch.empty(partial.shape[0] // world, partial.shape[1], dtype=partial.dtype)
        dist.reduce_scatter_tensor(rows, partial.contiguous())
        total = torch.empty_like(partial)
        dist.all_gather_into_tensor(total, rows)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        a = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)
        x = x + ReduceFromTensorParallel.apply(a @ w2, dist)
    return x
