"""p14 in another style: Megatron's layout. The residual stream is kept as [s/N, b, d] (the input shard copied into
that order once: the E/N the activation budget leaves room for), so the collectives gather and scatter dim 0
directly; the blocks see [b, s, d] through transposed views, and y is handed back as a view too."""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm


class GatherFromSequenceParallel(torch.autograd.Function):
    """[s/N, b, d] on each rank -> [s, b, d]."""

    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        whole = torch.empty((dist.get_world_size() * x.shape[0], *x.shape[1:]), dtype=x.dtype)
        dist.all_gather_into_tensor(whole, x.contiguous())
        return whole

    @staticmethod
    def backward(ctx, grad):
        mine = torch.empty((grad.shape[0] // ctx.dist.get_world_size(), *grad.shape[1:]), dtype=grad.dtype)
        ctx.dist.reduce_scatter_tensor(mine, grad.contiguous())
        return mine, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """[s, b, d] partial -> this rank's [s/N, b, d] of the sum."""

    @staticmethod
    def forward(ctx, partial, dist):
        ctx.dist = dist
        mine = torch.empty((partial.shape[0] // dist.get_world_size(), *partial.shape[1:]), dtype=partial.dtype)
        dist.reduce_scatter_tensor(mine, partial.contiguous())
        return mine

    @staticmethod
    def backward(ctx, grad):
        whole = torch.empty((ctx.dist.get_world_size() * grad.shape[0], *grad.shape[1:]), dtype=grad.dtype)
        ctx.dist.all_gather_into_tensor(whole, grad.contiguous())
        return whole, None


def sp_forward(dist, x, layers, n_heads):
    heads = n_heads // dist.get_world_size()

    def summed(grad):
        total = grad.clone()
        dist.all_reduce(total)
        return total

    h = x.transpose(0, 1).contiguous()  # [s/N, b, d]
    for w in layers:
        w.norm1.register_hook(summed)
        w.norm2.register_hook(summed)
        n = GatherFromSequenceParallel.apply(rms_norm(h, w.norm1), dist).transpose(0, 1)  # [b, s, d], a view
        h = h + ReduceScatterToSequenceParallel.apply(causal_attention(n, w.wqkv, w.wo, heads).transpose(0, 1), dist)
        n = GatherFromSequenceParallel.apply(rms_norm(h, w.norm2), dist).transpose(0, 1)
        h = h + ReduceScatterToSequenceParallel.apply((F.gelu(n @ w.w1) @ w.w2).transpose(0, 1), dist)
    return h.transpose(0, 1)
