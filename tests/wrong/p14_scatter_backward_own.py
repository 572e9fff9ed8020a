"""p14 mistake: the reduce-scatter's backward hands back this rank's own gradient in its own tokens' place (zeros
elsewhere) instead of all-gathering every rank's: each token's sum took a piece from every rank."""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm

MISTAKE = "the reduce-scatter's backward pads this rank's gradient with zeros instead of all-gathering"
EXPECTED_FAILURES = {"input gradient", "weight gradients", "norm gradients"}
DIAGNOSIS = "the reduce-scatter's backward handed each rank only its own tokens' gradient"


def sequence_chunks(t, n):
    b, s, d = t.shape
    return t.reshape(b, n, s // n, d).transpose(0, 1).reshape(n * b, s // n, d)


def from_sequence_chunks(chunks, n):
    nb, c, d = chunks.shape
    return chunks.view(n, nb // n, c, d).transpose(0, 1).reshape(nb // n, n * c, d)


def _gather(dist, x):
    n = dist.get_world_size()
    chunks = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(chunks, x.contiguous())
    return from_sequence_chunks(chunks, n)


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
        n, r = ctx.dist.get_world_size(), ctx.dist.get_rank()
        full = torch.zeros(grad.shape[0], grad.shape[1] * n, grad.shape[2], dtype=grad.dtype)
        full[:, r * grad.shape[1]:(r + 1) * grad.shape[1]] = grad  # the mistake: the others' tokens get nothing
        return full, None


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
