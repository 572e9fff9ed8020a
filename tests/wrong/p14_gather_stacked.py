"""p14 mistake: the all-gather's [N·b, s/N, d] buffer read as [b, s, d] without putting the blocks back along the
sequence: the tokens of the two sequences are mixed."""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm

MISTAKE = "the gathered chunks reshaped to [b, s, d] without reordering the tokens"
EXPECTED_FAILURES = {"output", "input gradient", "weight gradients", "norm gradients"}
DIAGNOSIS = "the gathered sequence is out of order"


def sequence_chunks(t, n):
    b, s, d = t.shape
    return t.reshape(b, n, s // n, d).transpose(0, 1).reshape(n * b, s // n, d)


def _gather(dist, x):
    n = dist.get_world_size()
    chunks = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype)  # [N·b, s/N, d]
    dist.all_gather_into_tensor(chunks, x.contiguous())
    return chunks.reshape(x.shape[0], -1, x.shape[2])  # the mistake: block order is not token order


def _reduce_scatter(dist, t):
    n = dist.get_world_size()
    mine = torch.empty((t.shape[0], t.shape[1] // n, t.shape[2]), dtype=t.dtype)
    dist.reduce_scatter_tensor(mine, sequence_chunks(t, n))
    return mine


class GatherFromSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return _gather(dist, x)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(ctx.dist, grad), None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        ctx.dist = dist
        return _reduce_scatter(dist, partial)

    @staticmethod
    def backward(ctx, grad):
        return _gather(ctx.dist, grad), None


def sp_forward(dist, x, layers, n_heads):
    heads = n_heads // dist.get_world_size()

    def all_reduced(grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

    for w in layers:
        w.norm1.register_hook(all_reduced)
        w.norm2.register_hook(all_reduced)
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm1), dist)
        x = x + ReduceScatterToSequenceParallel.apply(causal_attention(n, w.wqkv, w.wo, heads), dist)
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm2), dist)
        x = x + ReduceScatterToSequenceParallel.apply(F.gelu(n @ w.w1) @ w.w2, dist)
    return x
