"""p4 mistake: data parallelism dressed as tensor parallelism: every rank gathers the full weights, computes
its own quarter of the rows with them (so its FLOPs are its share), and averages the zero-padded results into
every rank's output. The output's values look like an averaging g; the real mistake is the gathered weights."""

import torch
import torch.nn.functional as F

MISTAKE = "the full weights gathered on every rank, each rank computing its own rows, averaged into every rank's output"
EXPECTED_FAILURES = {"output", "input gradient", "weight gradients", "forward communication", "peak memory"}
DIAGNOSIS = "the weights were gathered onto every rank"


class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward, all-reduce backward (Megatron's copy_to_tensor_model_parallel_region)."""

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
    """g: all-reduce forward, identity backward (Megatron's reduce_from_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, partial, dist):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def full(dist, shard, dim):
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard.contiguous())
    return torch.cat(parts, dim=dim)


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, dist, dim):
        ctx.rank, ctx.dim, ctx.size = dist.get_rank(), dim, shard.shape[dim]
        return full(dist, shard, dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.rank * ctx.size, ctx.size), None, None


class Avg(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, dist):
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        return t

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = x.shape[0] // world
    for w1, w2 in shards:
        W1, W2 = Gather.apply(w1, dist, 1), Gather.apply(w2, dist, 0)  # the full weights
        xs = x[rank * rows:(rank + 1) * rows]  # only this rank's rows: 1/N of the FLOPs
        branch = torch.zeros_like(x).index_copy(0, torch.arange(rank * rows, (rank + 1) * rows), F.gelu(xs @ W1) @ W2)
        x = x + Avg.apply(branch, dist)
    return x
