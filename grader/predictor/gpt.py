"""Megatron-LM's GPT, one tensor-parallel rank's slice of it, written as plain functions (puzzles/model.py's
transformer block, at scale): what a rank runs for one microbatch's forward through its layers.

One layer on rank r of t (SP: sequence parallelism; the shapes without it are [s, b, h] throughout):

    x [s/t, b, h] ──┬── layer_norm ── ColumnParallel(qkv) ──> q, k, v [s, b, 3h/t] ── core attention ─┐
                    │              (SP: all-gather in it)   (the rank's a/t heads)                    │
                    │   ┌──────────────── [s, b, h/t] ────────────────────────────────────────────────┘
                    │   └── RowParallel(proj) ── + bias ── dropout ──(+)──> h [s/t, b, h]
                    └──────────(SP: reduce-scatter in it)──────────────┘
    h ──┬── layer_norm ── ColumnParallel(fc1) [s, b, 4h/t] ── gelu ── RowParallel(fc2) ── + bias ── dropout ──(+)──> y
        └──────────────────────────────────────────────────────────────────────────────────────────────────┘

    core attention: scores = q k^T / sqrt(d) + causal mask (one batched product, the mask added as its bias, as
    Megatron's fused scale-mask-softmax does), softmax, dropout, @ v: a [b·a/t, s, s] matrix per layer.

What autograd keeps for backward, per layer, in units of s·b·h bytes (float16; masks 1 byte), is the paper's
34 + 5·a·s/h under SP (every term divided by t), or 10 + 24/t + 5·a·s/(h·t) without it (formulas.py):
layer norm inputs 2 + 2, their outputs (the products' inputs) 2 + 2, q k v 6, the softmax 2a·s/h, its dropout
mask a·s/h and output 2a·s/h, the projection's input 2, fc1's output (gelu's input) 8, gelu's output 8, two
dropout masks 1 + 1. Selective recomputation keeps q, k, v and computes the core again in backward (5·a·s/h
less); full recomputation keeps each layer's input only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .recompute import Recompute
from .tensor_parallel import ColumnParallelLinear, RowParallelLinear


@dataclass
class LayerWeights:
    """One layer's weights on one tensor-parallel rank (Megatron's [out, in] layout; t ranks):
    ln1_w, ln1_b, ln2_w, ln2_b [h]; qkv_w [3h/t, h], qkv_b [3h/t]; proj_w [h, h/t], proj_b [h];
    fc1_w [4h/t, h], fc1_b [4h/t]; fc2_w [h, 4h/t], fc2_b [h]."""

    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor
    proj_w: torch.Tensor
    proj_b: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor
    fc1_w: torch.Tensor
    fc1_b: torch.Tensor
    fc2_w: torch.Tensor
    fc2_b: torch.Tensor

    @staticmethod
    def shapes(h: int, ffn: int, t: int) -> dict:
        return {"ln1_w": (h,), "ln1_b": (h,), "qkv_w": (3 * h // t, h), "qkv_b": (3 * h // t,),
                "proj_w": (h, h // t), "proj_b": (h,), "ln2_w": (h,), "ln2_b": (h,), "fc1_w": (ffn // t, h),
                "fc1_b": (ffn // t,), "fc2_w": (h, ffn // t), "fc2_b": (h,)}


@dataclass
class LayerOps:
    """A learner's operators in place of the reference's collectives around each product (None: the reference's).
    Without SP: copy_to(x, tp) before each column-parallel product (puzzle 11's f) and reduce_from(partial, tp)
    after each row-parallel one (its g). With SP: gather(x, tp), [s/t, b, h] -> [s, b, h], before, and
    reduce_scatter(partial, tp), [s, b, h] -> [s/t, b, h], after (puzzle 14's pair)."""

    copy_to: object = None
    reduce_from: object = None
    gather: object = None
    reduce_scatter: object = None


@dataclass
class Layer:
    """What a layer's forward needs besides its input: weights, the rank's group, the sizes and the options."""

    weights: LayerWeights
    tp: object  # TensorParallel
    heads: int  # this rank's a/t
    sequence_parallel: bool
    dropout: float
    recompute: str  # "none", "selective", "full"
    ops: LayerOps | None = None

    def column(self, x, weight, bias):
        """A column-parallel product with this layer's operators before it."""
        ops, tp, sp = self.ops, self.tp, self.sequence_parallel
        if ops is None:
            return ColumnParallelLinear.apply(x, weight, bias, tp, sp)
        x = ops.gather(x, tp) if sp else ops.copy_to(x, tp)
        return ColumnParallelLinear.apply(x, weight, bias, tp, False, False)

    def row(self, x, weight):
        """A row-parallel product with this layer's operators after it."""
        ops, tp, sp = self.ops, self.tp, self.sequence_parallel
        if ops is None:
            return RowParallelLinear.apply(x, weight, tp, sp)
        partial = RowParallelLinear.apply(x, weight, tp, False, False)
        return ops.reduce_scatter(partial, tp) if sp else ops.reduce_from(partial, tp)


def drop(x, p: float):
    """Dropout as the GPU runs it: one kernel that writes the output and a 1-byte mask, which is what backward
    keeps (F.dropout on the CPU or meta device draws a mask in x's dtype and takes three kernels)."""
    return torch.native_dropout(x, p, True)[0] if p > 0 else x


def causal_bias(s: int, dtype, device) -> torch.Tensor:
    """[s, s]: 0 where query i may see key j (j <= i), -10000 above the diagonal (Megatron's masking value)."""
    # in place: the first out-of-place triu on the meta device in a process keeps its input alive (a ledger
    # measured it: the first run of a process held one [s, s] more than every later run)
    return torch.full((s, s), -10000.0, dtype=dtype, device=device).triu_(1)


def core_attention(q, k, v, bias, dropout: float):
    """softmax(q k^T / sqrt(d) + mask) @ v for each of the rank's heads. q, k, v: [s, b, n, d] (views into the
    qkv product) -> [s, b, n·d]."""
    s, b, n, d = q.shape
    q2 = q.reshape(s, b * n, d).transpose(0, 1)  # [b·n, s, d]
    k2 = k.reshape(s, b * n, d).permute(1, 2, 0)  # [b·n, d, s]
    v2 = v.reshape(s, b * n, d).transpose(0, 1)
    scores = torch.baddbmm(bias.expand(b * n, s, s), q2, k2, beta=1.0, alpha=1.0 / math.sqrt(d))  # [b·n, s, s]
    probs = drop(torch.softmax(scores, dim=-1), dropout)
    context = torch.bmm(probs, v2)  # [b·n, s, d]
    return context.view(b, n, s, d).permute(2, 0, 1, 3).reshape(s, b, n * d)  # [s, b, n·d]: a copy


def attention(x, layer: Layer, bias):
    w = layer.weights
    normed = F.layer_norm(x, (x.shape[-1],), w.ln1_w, w.ln1_b)
    qkv = layer.column(normed, w.qkv_w, w.qkv_b)  # [s, b, 3h/t]
    s, b = qkv.shape[0], qkv.shape[1]
    q, k, v = qkv.view(s, b, layer.heads, -1).chunk(3, dim=-1)  # [s, b, a/t, d] each
    if layer.recompute == "selective":
        context = Recompute.apply(core_attention, (bias, layer.dropout), q, k, v)
    else:
        context = core_attention(q, k, v, bias, layer.dropout)
    out = layer.row(context, w.proj_w)
    return x + drop(out + w.proj_b, layer.dropout)  # bias, dropout, residual


def mlp(x, layer: Layer):
    w = layer.weights
    normed = F.layer_norm(x, (x.shape[-1],), w.ln2_w, w.ln2_b)
    hidden = F.gelu(layer.column(normed, w.fc1_w, w.fc1_b), approximate="tanh")
    out = layer.row(hidden, w.fc2_w)
    return x + drop(out + w.fc2_b, layer.dropout)


def transformer_layer(x, layer: Layer, bias):
    return mlp(attention(x, layer, bias), layer)


def layers_forward(x, layers: list[Layer], bias):
    """A model chunk's layers; under full recomputation each keeps its input only and runs again in backward."""
    for layer in layers:
        if layer.recompute == "full":
            x = Recompute.apply(transformer_layer, (layer, bias), x)
        else:
            x = transformer_layer(x, layer, bias)
    return x


# ---- the first stage's embedding and the last stage's head


@dataclass
class Embedding:
    """The word embedding, split by vocabulary over the group ([V/t, h], rows first·V/t onwards), and the
    learned positions [s, h], whole on every rank. The last stage holds the word embedding too (tied weights)."""

    words: torch.Tensor
    positions: torch.Tensor | None
    first: int  # the first word this rank holds


def embed(tokens, emb: Embedding, tp, sequence_parallel: bool, dropout: float):
    """tokens [s, b] -> [s, b, h] (SP: this rank's [s/t, b, h]): each rank looks up the words it holds, zeros
    elsewhere, and the partial sums are all-reduced (SP: reduce-scattered)."""
    v = emb.words.shape[0]
    outside = (tokens < emb.first) | (tokens >= emb.first + v)
    local = (tokens - emb.first).masked_fill(outside, 0)
    words = F.embedding(local, emb.words).masked_fill(outside.unsqueeze(-1), 0.0)  # [s, b, h]: partial
    x = RowParallelSum.apply(words, tp, sequence_parallel)
    if emb.positions is not None:
        s = x.shape[0]
        start = tp.rank * s if sequence_parallel else 0
        x = x + emb.positions[start: start + s].unsqueeze(1)
    return drop(x, dropout)


class RowParallelSum(torch.autograd.Function):
    """The vocabulary-parallel embedding's sum over the group: all-reduce (SP: reduce-scatter) forward,
    identity (SP: all-gather) backward."""

    @staticmethod
    def forward(ctx, partial, tp, sequence_parallel: bool):
        ctx.tp, ctx.sp = tp, sequence_parallel
        if sequence_parallel:
            out, handle = tp.reduce_scatter(partial)
            if handle is not None:
                handle.wait()
            return out
        tp.all_reduce(partial)
        return partial

    @staticmethod
    def backward(ctx, grad):
        if not ctx.sp:
            return grad, None, None
        full, handle = ctx.tp.all_gather(grad)
        if handle is not None:
            handle.wait()
        return full, None, None


def head_loss(x, final_w, final_b, words, targets, tp, sequence_parallel: bool, n_micro: int):
    """The last stage: final layer norm, logits against the (tied) word embedding [s, b, V/t], and the
    vocabulary-parallel cross entropy, averaged over tokens and divided by the microbatches."""
    normed = F.layer_norm(x, (x.shape[-1],), final_w, final_b)
    logits = ColumnParallelLinear.apply(normed, words, None, tp, sequence_parallel)  # [s, b, V/t]
    return VocabParallelCrossEntropy.apply(logits.view(-1, logits.shape[-1]), targets.reshape(-1), tp,
                                           tp.rank * words.shape[0]) / n_micro


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross entropy over tokens when each rank holds V/t of the logits (Megatron's): the max, the sum of
    exponentials and the target's logit, each all-reduced over the group, in float32. Keeps the softmax
    ([tokens, V/t], float32) for backward: softmax minus the one-hot target."""

    @staticmethod
    def forward(ctx, logits, targets, tp, first: int):
        ctx.dtype = logits.dtype
        logits = logits.float()
        top = logits.max(dim=-1, keepdim=True)[0]
        tp.all_reduce(top, op=tp.dist.ReduceOp.MAX)
        shifted = logits.sub_(top)
        v = shifted.shape[-1]
        outside = (targets < first) | (targets >= first + v)
        local = (targets - first).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        tp.all_reduce(picked)
        exp = shifted.exp_()
        total = exp.sum(dim=-1)
        tp.all_reduce(total)
        loss = (total.log() - picked).mean()
        ctx.save_for_backward(exp.div_(total.unsqueeze(-1)), local, outside)  # the softmax, in place
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        n = softmax.shape[0]
        one_hot = (~outside).to(softmax.dtype).unsqueeze(-1)
        grad_logits = softmax.scatter_add_(-1, local.unsqueeze(-1), -one_hot).mul_(grad / n)
        return grad_logits.to(ctx.dtype), None, None, None
