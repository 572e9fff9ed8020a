"""Naive p14: plain tensor parallelism (puzzle 4's f and g on the transformer block) on the whole sequence. Every
rank gathers the sequence at the start, runs the norms and the residual stream on all s tokens, all-reduces the
partial outputs of the attention and the MLP, and keeps its own tokens of the output at the end. The values are
right, but every rank holds the norms' inputs and the residual stream for the whole sequence (the activation memory
sequence parallelism saves), repeats their work N times, and moves the input and the output's gradient besides the
all-reduces."""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm

EXPECTED_FAILURES = {"activation memory", "compute", "forward communication", "backward communication"}
DIAGNOSIS = "as much as plain tensor parallelism holds"


def _gather(dist, x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=1)


class GatherSequence(torch.autograd.Function):
    """The whole sequence on every rank; backward: this rank's tokens of the gradient (every rank's is whole)."""

    @staticmethod
    def forward(ctx, x, dist):
        ctx.rank, ctx.n = dist.get_rank(), x.shape[1]
        return _gather(dist, x)

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n], None


class KeepOwnTokens(torch.autograd.Function):
    """This rank's tokens of the (identical) output; backward: every rank's gradient gathered, the whole dL/dy."""

    @staticmethod
    def forward(ctx, y, dist):
        ctx.dist = dist
        n = y.shape[1] // dist.get_world_size()
        r = dist.get_rank()
        return y[:, r * n:(r + 1) * n].clone()

    @staticmethod
    def backward(ctx, grad):
        return _gather(ctx.dist, grad), None


class CopyToTensorParallel(torch.autograd.Function):  # p4's f
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.dist.all_reduce(grad)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):  # p4's g
    @staticmethod
    def forward(ctx, partial, dist):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


GatherFromSequenceParallel, ReduceScatterToSequenceParallel = GatherSequence, KeepOwnTokens


def sp_forward(dist, x, layers, n_heads):
    heads = n_heads // dist.get_world_size()
    x = GatherSequence.apply(x, dist)
    for w in layers:
        n = CopyToTensorParallel.apply(rms_norm(x, w.norm1), dist)
        x = x + ReduceFromTensorParallel.apply(causal_attention(n, w.wqkv, w.wo, heads), dist)
        n = CopyToTensorParallel.apply(rms_norm(x, w.norm2), dist)
        x = x + ReduceFromTensorParallel.apply(F.gelu(n @ w.w1) @ w.w2, dist)
    return KeepOwnTokens.apply(x, dist)
