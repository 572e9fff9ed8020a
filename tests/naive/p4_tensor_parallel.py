"""Naive p4: a "tensor-parallel" layer that all-gathers the full weights from the shards and runs the serial block
on every rank. The values are right (the gradient of the gathered weight is sliced back to the shard), but every
rank holds all the weights, W instead of W/N, and no activation is ever all-reduced."""

import torch
import torch.nn.functional as F

EXPECTED_FAILURES = {"peak memory", "compute", "forward communication"}
DIAGNOSIS = "full weights gathered onto every rank"


class GatherShards(torch.autograd.Function):
    """Forward: the full weight, the ranks' shards concatenated along `dim`. Backward: this rank's slice."""

    @staticmethod
    def forward(ctx, shard, dist, dim):
        ctx.rank, ctx.dim, ctx.size = dist.get_rank(), dim, shard.shape[dim]
        parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, shard.contiguous())
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.rank * ctx.size, ctx.size), None, None


class CopyToTensorParallel(torch.autograd.Function):  # unused by this answer
    @staticmethod
    def forward(ctx, x, dist):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):  # unused by this answer
    @staticmethod
    def forward(ctx, partial, dist):
        return partial

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    for w1_r, w2_r in shards:
        w1, w2 = GatherShards.apply(w1_r, dist, 1), GatherShards.apply(w2_r, dist, 0)
        x = x + F.gelu(x @ w1) @ w2
    return x
