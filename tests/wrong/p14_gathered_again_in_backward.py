"""p14 mistake (a trade this puzzle does not make): Megatron's fuller sequence parallelism, which saves the shard of
the norm's output instead of the gathered sequence and all-gathers it again in backward for the weight gradient.
Less activation memory, but one all-gather more per column-parallel product: more bytes than tensor parallelism's
all-reduces, which is this puzzle's rule."""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm

MISTAKE = "the norm's output saved as a shard and all-gathered again in backward (more bytes than the rule)"
EXPECTED_FAILURES = {"backward communication"}
DIAGNOSIS = "the norm's output was gathered again in backward"


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


class GatherThenProduct(torch.autograd.Function):
    """gather(n_r) @ w, keeping only n_r: the weight's gradient needs the whole n, gathered again in backward."""

    @staticmethod
    def forward(ctx, n_r, w, dist):
        ctx.dist = dist
        ctx.save_for_backward(n_r, w)
        return _gather(dist, n_r) @ w

    @staticmethod
    def backward(ctx, grad):
        n_r, w = ctx.saved_tensors
        n = _gather(ctx.dist, n_r)  # the mistake: a second all-gather of the same tensor
        grad_w = n.reshape(-1, n.shape[-1]).T @ grad.reshape(-1, grad.shape[-1])
        return _reduce_scatter(ctx.dist, grad @ w.T), grad_w, None


def attention_from_qkv(qkv, wo, heads):
    b, s, _ = qkv.shape
    width = qkv.shape[-1] // 3
    hd = width // heads
    q, k, v = (t.view(b, s, heads, hd).transpose(1, 2) for t in qkv.split(width, dim=-1))
    scores = q @ k.transpose(-2, -1) / hd ** 0.5
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    p = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return (p @ v).transpose(1, 2).reshape(b, s, width) @ wo


def sp_forward(dist, x, layers, n_heads):
    heads = n_heads // dist.get_world_size()

    def all_reduced(grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

    for w in layers:
        w.norm1.register_hook(all_reduced)
        w.norm2.register_hook(all_reduced)
        qkv = GatherThenProduct.apply(rms_norm(x, w.norm1), w.wqkv, dist)
        x = x + ReduceScatterToSequenceParallel.apply(attention_from_qkv(qkv, w.wo, heads), dist)
        u = GatherThenProduct.apply(rms_norm(x, w.norm2), w.w1, dist)
        x = x + ReduceScatterToSequenceParallel.apply(F.gelu(u) @ w.w2, dist)
    return x
