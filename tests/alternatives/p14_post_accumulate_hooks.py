"""p14 in another style: the norms' gradients all-reduced in place once autograd has accumulated them
(register_post_accumulate_grad_hook, torch >= 2.1), asynchronously, each waited for before the next; the sequence
collectives as module-level helpers the Functions share."""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm


def gather_sequence(dist, x):
    """[b, s/N, d] -> [b, s, d]"""
    n = dist.get_world_size()
    chunks = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(chunks, x.contiguous(), async_op=True).wait()
    return torch.cat(chunks.chunk(n), dim=1)


def reduce_scatter_sequence(dist, t):
    """[b, s, d] partial -> [b, s/N, d] of the sum"""
    n = dist.get_world_size()
    chunks = t.chunk(n, dim=1)
    mine = torch.empty_like(chunks[0])
    dist.reduce_scatter_tensor(mine, torch.cat(chunks), async_op=True).wait()
    return mine


class GatherFromSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return gather_sequence(dist, x)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_sequence(ctx.dist, grad), None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        ctx.dist = dist
        return reduce_scatter_sequence(dist, partial)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(ctx.dist, grad), None


def sp_forward(dist, x, layers, n_heads):
    def sum_over_ranks(weight):
        dist.all_reduce(weight.grad, async_op=True).wait()

    for w in layers:
        w.norm1.register_post_accumulate_grad_hook(sum_over_ranks)
        w.norm2.register_post_accumulate_grad_hook(sum_over_ranks)
    heads = n_heads // dist.get_world_size()
    for w in layers:
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm1), dist)
        x = x + ReduceScatterToSequenceParallel.apply(causal_attention(n, w.wqkv, w.wo, heads), dist)
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm2), dist)
        x = x + ReduceScatterToSequenceParallel.apply(F.gelu(n @ w.w1) @ w.w2, dist)
    return x
