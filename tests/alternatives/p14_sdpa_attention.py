"""p14 in another style: the rank's heads through torch's own F.scaled_dot_product_attention(is_causal=True)
instead of the written-out causal_attention (it keeps less for backward, and counts as attention products); the
sequence gathered into a list and scattered from a cat of chunks."""

import torch
import torch.nn.functional as F

from puzzles.model import rms_norm


def heads_of_this_rank(n, wqkv, wo, heads):
    b, s, _ = n.shape
    width = wqkv.shape[1] // 3
    q, k, v = (t.view(b, s, heads, width // heads).transpose(1, 2) for t in (n @ wqkv).split(width, dim=-1))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, s, hd]
    return out.transpose(1, 2).reshape(b, s, width) @ wo


class GatherFromSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return ReduceScatterToSequenceParallel.forward(ctx, grad, ctx.dist), None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        ctx.dist = dist
        pieces = partial.chunk(dist.get_world_size(), dim=1)
        mine = torch.empty_like(pieces[0])
        dist.reduce_scatter_tensor(mine, torch.cat(pieces))
        return mine

    @staticmethod
    def backward(ctx, grad):
        return GatherFromSequenceParallel.forward(ctx, grad, ctx.dist), None


def sp_forward(dist, x, layers, n_heads):
    def summed(grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

    heads = n_heads // dist.get_world_size()
    for w in layers:
        w.norm1.register_hook(summed)
        w.norm2.register_hook(summed)
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm1), dist)
        x = x + ReduceScatterToSequenceParallel.apply(heads_of_this_rank(n, w.wqkv, w.wo, heads), dist)
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm2), dist)
        x = x + ReduceScatterToSequenceParallel.apply(F.gelu(n @ w.w1) @ w.w2, dist)
    return x
