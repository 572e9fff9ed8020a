"""p4, another style: Megatron's own way, all-reducing in place on the tensors handed in (the gradient in f's
backward, the partial output in g's forward), with F.linear for the matmuls."""

import torch
import torch.nn.functional as F


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return x

    @staticmethod
    def backward(ctx, grad):
        ctx.dist.all_reduce(grad)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        dist.all_reduce(partial)
        return partial

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
        h = F.gelu(F.linear(CopyToTensorParallel.apply(x, dist), w1.t()))
        x = x + ReduceFromTensorParallel.apply(F.linear(h, w2.t()), dist)
    return x
