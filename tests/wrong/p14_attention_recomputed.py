"""p14 mistake (a trade this puzzle does not make): selective recomputation, the attention checkpointed
(torch.utils.checkpoint) so that its scores and softmax are not kept but computed again in backward: less
activation memory, but more compute than the rank's share."""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm

import torch.utils.checkpoint

MISTAKE = "the attention recomputed in backward (checkpointed): compute beyond the share"
EXPECTED_FAILURES = {"compute"}
DIAGNOSIS = "run again in backward"


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
        attention = torch.utils.checkpoint.checkpoint(causal_attention, n, w.wqkv, w.wo, heads, use_reentrant=False)
        x = x + ReduceScatterToSequenceParallel.apply(attention, dist)  # the mistake: recomputed in backward
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm2), dist)
        x = x + ReduceScatterToSequenceParallel.apply(F.gelu(n @ w.w1) @ w.w2, dist)
    return x
