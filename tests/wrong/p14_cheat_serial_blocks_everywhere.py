"""p14 cheat (found blind): every rank gathers every weight and runs the serial blocks on the whole sequence. The memory
figure is far above plain tensor parallelism's, and no single mistake explains it: no likely cause for that check."""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm

MISTAKE = "all weights gathered and the serial blocks run on every rank"
EXPECTED_FAILURES = {"weight gradients", "norm gradients", "activation memory", "compute", "forward communication"}
DIAGNOSIS = "its share, the serial blocks' work / N"


def sequence_chunks(t, n):
    """[b, s, d] -> [n·b, s/n, d], contiguous: rows i·b to (i+1)·b - 1 hold tokens i·s/n to (i+1)·s/n - 1 of every
    sequence, the tokens rank i keeps. That is the layout the collectives cut and join along dim 0 (block i is rank
    i's); a copy, since the sequence is dim 1."""
    b, s, d = t.shape
    return t.reshape(b, n, s // n, d).transpose(0, 1).reshape(n * b, s // n, d)


def from_sequence_chunks(chunks, n):
    """[n·b, s/n, d] -> [b, s, d]: the n blocks side by side along the sequence again (a copy)."""
    nb, c, d = chunks.shape
    return chunks.view(n, nb // n, c, d).transpose(0, 1).reshape(nb // n, n * c, d)


class GatherFromSequenceParallel(torch.autograd.Function):
    # all_gather into a list, then cat along the sequence
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        n = dist.get_world_size()
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        dist = ctx.dist
        n = dist.get_world_size()
        b, s, d = grad.shape
        out = torch.empty((b, s // n, d), dtype=grad.dtype)
        dist.reduce_scatter_tensor(out, sequence_chunks(grad, n))
        return out, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        ctx.dist = dist
        n = dist.get_world_size()
        b, s, d = partial.shape
        out = torch.empty((b, s // n, d), dtype=partial.dtype)
        dist.reduce_scatter_tensor(out, sequence_chunks(partial, n))
        return out

    @staticmethod
    def backward(ctx, grad):
        dist = ctx.dist
        n = dist.get_world_size()
        grad = grad.contiguous()
        parts = [torch.empty_like(grad) for _ in range(n)]
        dist.all_gather(parts, grad)
        return torch.cat(parts, dim=1), None


class _AllReduceGrad(torch.autograd.Function):
    """identity forward, all-reduce backward (f on a weight)."""
    @staticmethod
    def forward(ctx, w, dist):
        ctx.dist = dist
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        ctx.dist.all_reduce(g)
        return g, None


class _GatherW(torch.autograd.Function):
    """all-gather a weight piece along dim `dim`; backward: this rank's slice of the (identical) gradient."""
    @staticmethod
    def forward(ctx, wp, dist, dim):
        ctx.dist, ctx.dim = dist, dim
        n = dist.get_world_size()
        parts = [torch.empty_like(wp) for _ in range(n)]
        dist.all_gather(parts, wp.contiguous())
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, g):
        r = ctx.dist.get_rank(); n = ctx.dist.get_world_size()
        return g.chunk(n, dim=ctx.dim)[r].contiguous(), None, None


def sp_forward(dist, x, layers, n_heads):
    # every rank gathers every weight and the whole input, runs the serial blocks, keeps its tokens
    from puzzles.model import transformer_block, TransformerWeights
    n = dist.get_world_size(); r = dist.get_rank()
    h = GatherFromSequenceParallel.apply(x, dist)
    for w in layers:
        # wqkv pieces: q,k,v columns of this rank's heads; rebuild [d, 3d] as q's of all, k's of all, v's of all
        parts = [p for p in w.wqkv.split(w.wqkv.shape[1] // 3, dim=1)]
        q, k, v = (_GatherW.apply(p, dist, 1) for p in parts)
        full = TransformerWeights(w.norm1, torch.cat([q, k, v], dim=1), _GatherW.apply(w.wo, dist, 0), w.norm2,
                                  _GatherW.apply(w.w1, dist, 1), _GatherW.apply(w.w2, dist, 0))
        h = transformer_block(h, full, n_heads)
    c = h.shape[1] // n
    return h[:, r * c:(r + 1) * c]
