"""p4's diagnosis by replay: all N ranks run together in one serial autograd graph, with f and g replaced by
operators whose forward and backward are each "keep your own" or "sum over the ranks" (times k). An answer that
matches one mistaken pair to float64 precision is named; one that matches none gets no likely cause.

Here too: the puzzle's sizes and `shard`, which both the spec and the replay need."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn

N, B, D, H, L = 4, 32, 64, 512, 3
HS = H // N  # hidden columns per rank
MODEL_TOL = 1e-8


def shard(layers, rank):
    """Rank r's pieces: the r-th column block of w1 and the r-th row block of w2, for every block."""
    cols = slice(rank * HS, (rank + 1) * HS)
    return [(w1.detach()[:, cols].clone(), w2.detach()[cols, :].clone()) for w1, w2 in layers]


# ---- replaying mistakes. All N ranks run together in one serial autograd graph, each with its own copy of x and
# its own shards; the only link between them is `_Link`, an operator on the N ranks' tensors whose forward and
# backward are each one of: keep each rank's own tensor ("id"), or give every rank the sum ("sum") times k.
# The right answer is in = ("id", "sum") (f) and out = ("sum", "id") (g); each common mistake changes one of them.

ID, SUM, AVG, TWICE = ("id", 1), ("sum", 1), ("sum", 1 / N), ("sum", N)
WITH_RESIDUAL = ("sum", 1, "residual")  # g's forward given x + branch: the residual is summed over the ranks too


def _combine(mode, tensors):
    op, k = mode[:2]  # (autograd hands backward zeros, never None, for outputs that got no gradient)
    if op == "id":
        return [t * k if k != 1 else t.clone() for t in tensors]
    total = sum(tensors)
    return [total * k if k != 1 else total.clone() for _ in tensors]


class _Link(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fwd, bwd, *tensors):
        ctx.bwd = bwd
        return tuple(_combine(fwd, tensors))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *_combine(ctx.bwd, grads))


def replay(inputs, f_mode, g_mode):
    """Every rank's y, x.grad and shard gradients when f is `f_mode` = (forward, backward) and g is `g_mode`."""
    shards = [[(w1.requires_grad_(), w2.requires_grad_()) for w1, w2 in shard(inputs["layers"], r)]
              for r in range(N)]
    xs = [inputs["x"].detach().clone().requires_grad_() for _ in range(N)]
    hs = xs
    for i in range(L):
        ins = _Link.apply(*f_mode, *hs)
        partials = [F.gelu(ins[r] @ shards[r][i][0]) @ shards[r][i][1] for r in range(N)]
        if g_mode[0] == WITH_RESIDUAL:
            hs = list(_Link.apply(*g_mode, *[h + p for h, p in zip(hs, partials)]))
        else:
            hs = [h + o for h, o in zip(hs, _Link.apply(*g_mode, *partials))]
    sum(loss_fn(h, inputs["target"]) for h in hs).backward()  # the ranks' graphs meet only in _Link
    return [{"y": hs[r].detach(), "x_grad": xs[r].grad, "grads": [(w1.grad, w2.grad) for w1, w2 in shards[r]]}
            for r in range(N)]


# name -> (f's (forward, backward), g's (forward, backward), the diagnosis). The forward mistakes are named from
# y alone; the backward ones (y right) from x.grad and the shard gradients.
FORWARD_MISTAKES = {
    "f_forward_reduces": (
        (SUM, SUM), (SUM, ID),
        "the output is what you get when f's forward all-reduces too: every rank already holds the whole x, so "
        f"summing it over the ranks feeds {N}·x into the block (all-reduce in both f and g?). f's forward is the "
        "identity; only g's forward all-reduces"),
    "g_average": (
        (ID, SUM), (AVG, ID),
        f"the MLP branch is exactly {N}x too small: g's forward averaged the partial outputs (ReduceOp.AVG or a "
        "division by the world size). The partials a_r @ w2_r are pieces of one matrix product: sum them"),
    "g_forward_no_reduce": (
        (ID, SUM), (ID, ID),
        "each rank's output is built from its own partial sums a_r @ w2_r only: g's forward must all-reduce "
        "(sum) the partial outputs of the row-parallel layer"),
    "branch_twice": (
        (ID, SUM), (TWICE, ID),
        f"the MLP branch is exactly {N}x too large: the output was all-reduced twice (once the partials are "
        f"summed, every rank holds the same tensor, and summing it again multiplies it by {N})"),
    "f_g_swapped": (
        (SUM, ID), (ID, SUM),
        "f and g are swapped: the input went through an all-reduce (summing the ranks' copies of x) and the "
        "partial outputs did not. f (identity forward) goes before w1, g (all-reduce forward) after w2"),
    "residual_inside_g": (
        (ID, SUM), (WITH_RESIDUAL, ID),
        f"the residual went into g: g's forward all-reduced x + branch, so each block's output holds x {N} times (once "
        f"per rank). g sums the partial outputs of the branch only; add the residual after it: x = x + g(branch)"),
}

BACKWARD_MISTAKES = {
    "f_backward_identity": (
        (ID, ID), (SUM, ID),
        "x.grad on each rank holds only that rank's share of the branch's input gradient: f's backward must "
        "all-reduce (sum) the partial input gradients, since each rank's w1_r sees only its own columns"),
    "g_backward_reduces": (
        (ID, SUM), (SUM, SUM),
        f"the gradients through the MLP branch are exactly {N}x too large (the last block's weight gradients "
        f"are {N}x the serial ones): g's backward all-reduces too. Every rank already holds the whole dL/dy, "
        "so g's backward is the identity"),
    "f_backward_average": (
        (ID, AVG), (SUM, ID),
        f"the branch's input gradient is {N}x too small: f's backward averaged (ReduceOp.AVG or a division by "
        "the world size); the ranks' partial input gradients must be summed"),
    "g_backward_divides": (
        (ID, SUM), (SUM, ("id", 1 / N)),
        f"the gradients through the MLP branch are exactly {N}x too small: g's backward divided the gradient by the "
        f"world size. g's backward is the identity: every rank already holds the whole dL/dy"),
    "f_backward_twice": (
        (ID, TWICE), (SUM, ID),
        f"the branch's input gradient is exactly {N}x too large: f's backward all-reduced twice (once the partial "
        f"input gradients are summed, every rank holds the same tensor, and summing it again multiplies it by {N})"),
    "reduce_in_g_backward": (
        (ID, ID), (SUM, SUM),
        "the backward all-reduce is in g instead of f: g's backward should be the identity (every rank holds the "
        "whole dL/dy), and f's backward should all-reduce the partial input gradients"),
}


def matches(got, expected, keys) -> bool:
    def close(a, b):
        if not isinstance(a, torch.Tensor) or b is None or a.shape != b.shape:
            return False
        return (a - b).abs().max().item() <= MODEL_TOL * max(1.0, b.abs().max().item())

    for key in keys:
        if key == "grads":
            g = got.get("grads")
            if not isinstance(g, (list, tuple)) or len(g) != L or any(
                    not isinstance(p, (tuple, list)) or len(p) != 2 for p in g):
                return False
            if not all(close(a, b) for pa, pb in zip(g, expected["grads"]) for a, b in zip(pa, pb)):
                return False
        elif not close(got.get(key), expected[key]):
            return False
    return True


class Models:
    """The replayed mistakes, computed on demand (only when an answer is wrong) and cached."""

    def __init__(self, inputs):
        self.inputs, self.cache = inputs, {}

    def get(self, name):
        if name not in self.cache:
            f_mode, g_mode, _ = {**FORWARD_MISTAKES, **BACKWARD_MISTAKES}[name]
            self.cache[name] = replay(self.inputs, f_mode, g_mode)
        return self.cache[name]
