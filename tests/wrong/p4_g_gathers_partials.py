"""p4 mistake (of a kind): g's forward all-gathers every rank's partial output and sums the list itself. Right
values, but an all-gather of N partials sends twice what an all-reduce of one does."""

import torch
import torch.nn.functional as F

MISTAKE = "g's forward all-gathers the partial outputs and sums them locally instead of all-reducing"
EXPECTED_FAILURES = {"forward communication", "compute"}  # g sums the gathered partials itself
DIAGNOSIS = "were gathered"


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
        parts = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, partial.contiguous())
        return torch.stack(parts).sum(0)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        a = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)
        x = x + ReduceFromTensorParallel.apply(a @ w2, dist)
    return x
