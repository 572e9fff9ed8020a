"""p4 mistake: g's all-reduce once, at the end of the forward, on the partial outputs of all the blocks added
up: each block after the first sees its own rank's partial input instead of the whole output of the block before.
It sends less than the budget, so only the values say it."""

import torch
import torch.nn.functional as F

MISTAKE = "the partial outputs are summed over the blocks and reduced once, at the end of the forward"
EXPECTED_FAILURES = {"output", "input gradient", "weight gradients"}
DIAGNOSIS = "reduced once, at the end"


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


def tp_forward(dist, x, shards):
    branches = 0
    for w1, w2 in shards:
        a = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)
        branches = branches + a @ w2  # partial sums, added up over the blocks
    return x + ReduceFromTensorParallel.apply(branches, dist)  # one all-reduce at the end
