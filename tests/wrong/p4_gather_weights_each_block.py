"""p4 cheat: each block all-gathers the full weights from the shards, runs the serial block, and drops its own
names for them at once, hoping the peak stays low. Right values, but every rank computes the whole MLP, the weights
travel instead of the activations, and autograd keeps the gathered weights for backward anyway."""

import torch
import torch.nn.functional as F

MISTAKE = "each block gathers the full weights and runs the serial block on every rank"
EXPECTED_FAILURES = {"compute", "forward communication", "peak memory"}
DIAGNOSIS = "the work of the whole MLP"


class GatherShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, dist, dim):
        ctx.rank, ctx.dim, ctx.size = dist.get_rank(), dim, shard.shape[dim]
        parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, shard.contiguous())
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.rank * ctx.size, ctx.size), None, None


class CopyToTensorParallel(torch.autograd.Function):  # unused
    @staticmethod
    def forward(ctx, x, dist):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):  # unused
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
        del w1, w2
    return x
