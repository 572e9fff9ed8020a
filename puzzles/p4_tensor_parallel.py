# Generated from solutions/p4_tensor_parallel.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest bd57e00cc180)
"""Puzzle 4 — Tensor parallel (the Megatron MLP).

Data parallelism copies every weight onto every rank. When the weights themselves are too big for one device,
split each weight matrix across the ranks instead, and move activations rather than weights. The MLP of a block,

    block(x) = x + gelu(x @ w1) @ w2        x: [B, d]   w1: [d, h]   w2: [h, d]

splits with no approximation at all, because of two facts:

  1. cut w1 into column blocks: x @ [w1_0 | w1_1 | w1_2 | w1_3] = [x @ w1_0 | x @ w1_1 | ...], and gelu acts on
     each entry alone, so rank r can compute its own slice a_r = gelu(x @ w1_r) of the hidden layer [B, h/N];
  2. cut w2 into the matching row blocks: [a_0 | a_1 | a_2 | a_3] @ w2 = a_0 @ w2_0 + a_1 @ w2_1 + ...,
     so each rank's a_r @ w2_r is a *partial sum* of the output, and one all-reduce adds them up.

Rank r holds only w1_r = w1[:, r·h/N:(r+1)·h/N] and w2_r = w2[r·h/N:(r+1)·h/N, :]:

                f           column-parallel              row-parallel                g
    forward:  x ──copy──> x ── @ w1_r ──> gelu ──> a_r ── @ w2_r ──> partial_r ──all-reduce──> (+) ──> y
              │                                   [B, h/N]             [B, d]                    ▲
              └─────────────────────────────────── residual ─────────────────────────────────────┘

    backward: dL/dx <──all-reduce── each rank's partial dL/dx ... dL/dpartial_r <──copy── dL/dy

f and g are conjugate: f is the identity going forward and an all-reduce going backward (each rank's w1_r sees
only its own columns, so each rank's dL/dx is a partial sum); g is an all-reduce going forward and the identity
going backward (every rank already holds the whole dL/dy). One all-reduce per block each way, of a [B, d]
activation; the weights never move.

Write three things:
  - `CopyToTensorParallel` (f), a torch.autograd.Function: `CopyToTensorParallel.apply(x, dist)` returns x;
    its backward all-reduces the gradient (and returns None for `dist`).
  - `ReduceFromTensorParallel` (g), a torch.autograd.Function: `ReduceFromTensorParallel.apply(partial, dist)`
    returns the sum of every rank's `partial`; its backward passes the gradient through unchanged.
  - `tp_forward(dist, x, shards) -> y`: the stack of blocks, `shards` being this rank's list of (w1_r, w2_r), one
    pair per block ([64, 128] and [128, 64], requires_grad); every block is
    `x = x + g(gelu(f(x) @ w1_r) @ w2_r)`. Every rank is given the whole input x [32, 64] (requires_grad) and
    returns the whole output y.
The grader then computes `loss_fn(y, target)` (from puzzles.model) on every rank and calls `backward()`.

Checks (sizes: 4 ranks, batch B=32, d=64, h=512, L=3 blocks; W = 2·L·d·h·8 = 1,572,864 bytes of weights):
  - output: y on every rank equals the serial model's output.
  - input gradient: x.grad on every rank equals the serial one.
  - weight gradients: rank r's w1_r.grad and w2_r.grad equal the matching slices of the serial w1.grad
    (columns) and w2.grad (rows).
  - compute, every op counted on the simulated GPU (README, "The clock"): each rank computes its 1/N share of the
    MLP and the [B, d] work that every rank repeats, 9,480,224 FLOPs (per block 2 forward and 4 backward matmuls
    of 2·B·d·h/N, gelu on its [B, h/N] slice and gelu's backward, the residual add and the two input gradients'
    add on [B, d]; the loss's backward), plus L·B·d = 6,144 for bookkeeping: at most 9,486,368 FLOPs. It
    multiplies its own shards, never the full weights. And at least its products, 12·B·d·h·L/N = 9,437,184 FLOPs
    of matmuls: a product written as elementwise multiplies and sums costs as many FLOPs, none of them products.
  - forward communication: the bytes each rank sends outside backward, summed over every collective (ring
    algorithm), at most one all-reduce of a [B, d] activation per block, L·2(N-1)/N·B·d·8 = 73,728 bytes (g's).
  - backward communication: the same during backward, at most 73,728 bytes (f's).
  - peak memory: each rank's peak at most 2·W/N + L·(2·B·h/N + B·d)·8 + 4·B·d·8 = 1,097,728 bytes: its weight
    shards (W/N) and their gradients (W/N); per block, the activations autograd saves (x @ w1_r and its gelu,
    [B, h/N] each, and the block's output [B, d]); x, the target and two [B, d] gradients in flight. A rank that
    holds the full weights (W = 1,572,864 bytes) cannot fit.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - `dist.all_reduce(t)` sums in place, into `t` itself: in g's forward, reduce a fresh copy (`partial.clone()`)
    rather than a tensor that autograd may have saved for backward.
  - In `backward(ctx, grad)`, return one gradient per input of `forward`: `return grad, None` (None for `dist`).
    Keep `dist` on `ctx` in forward (`ctx.dist = dist`) to use it in backward.
  - f's forward does nothing to the data: every rank already holds the whole x.
"""

import torch
import torch.nn.functional as F


class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward, all-reduce backward (Megatron's copy_to_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, x, dist):
        raise NotImplementedError("p4: write CopyToTensorParallel.forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("p4: write CopyToTensorParallel.backward")


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce forward, identity backward (Megatron's reduce_from_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, partial, dist):
        raise NotImplementedError("p4: write ReduceFromTensorParallel.forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("p4: write ReduceFromTensorParallel.backward")


def tp_forward(dist, x, shards):
    raise NotImplementedError("p4: write tp_forward")
