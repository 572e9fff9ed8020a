# Generated from solutions/p1_checkpointing.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest a9100e3ebc3a)
"""Puzzle 1 — Activation checkpointing.

To backpropagate through a block, autograd keeps what the block's forward computed: for our block
`x + gelu(x @ w1) @ w2` that is x @ w1 and gelu(x @ w1), two [B, h] tensors, and the block's output, which is
the next block's input. For a stack of L blocks that is L blocks' worth of activations, held from the forward
until the backward reaches them. Checkpointing trades compute for memory: the forward keeps only the input of
every k-th block (the *checkpoints*) and builds no graph; the backward takes the segments last first, recomputes
each one from its checkpoint, this time with autograd on, and backpropagates through it at once, so only one
segment's activations are ever alive:

    forward (no graph):   x=c0 -> [b0 b1 b2 b3] -> c1 -> [b4 b5 b6 b7] -> c2 -> [b8 .. b11] -> c3 -> [b12 .. b15] -> y
                          keep c0, c1, c2, c3 (L/k = 4 tensors of [B, d]) and y; everything else dies at once

    backward:             c3 -> recompute b12..b15 with graph -> backward(grad_y)          -> grad of c3
                          c2 -> recompute b8..b11  with graph -> backward(grad of c3)      -> grad of c2
                          c1 -> ...                                                        -> grad of c1
                          c0 -> ...                                                        -> grad of c0 = grad_x

Memory goes from L blocks of activations (L·A) to L/k checkpoints plus one segment of activations
((L/k)·C + k·A, C and A below); the price is one more forward pass. The first term shrinks as k grows and the
second grows, so the sum is smallest near k = sqrt(L·C/A). Here a block's activations are 9 times its input
(A = 9·C), so that optimum is near 1, which is why trainers of transformers checkpoint every layer; this puzzle
fixes k = 4 so that you see both terms.

Write two functions (`block` and `forward` from puzzles.model run blocks; write the checkpointing yourself:
torch.utils.checkpoint is switched off while this puzzle is graded):

  `checkpointed_forward(x, layers, k) -> (saved, y)`
    - `x`: the batch, [256, 32]; `layers`: a list of 16 pairs (w1 [32, 128], w2 [128, 32]) with requires_grad;
      `k`: the segment length, 4 (it divides L).
    - run every block without building the autograd graph, keep the inputs of blocks 0, k, 2k, ... in `saved`
      (any container you like: it is handed back to you unchanged) and return it with the output y [256, 32].

  `checkpointed_backward(saved, layers, k, grad_y) -> grad_x`
    - `grad_y`: the gradient of the loss with respect to y (the grader computes the loss from your y).
    - for each segment, last first: recompute it from its checkpoint with autograd on (the checkpoint detached,
      with requires_grad, so that backward gives you its gradient), backpropagate into it the gradient of its
      output, and hand the gradient of its input to the segment before it.
    - every weight's gradient ends in its `.grad` (backward accumulates there); return the gradient of x.

Checks (sizes: batch B = 256, d = 32, h = 128, L = 16 blocks, k = 4, float64 = 8 bytes):
  - output and loss equal the serial model's; every weight's gradient and grad_x equal the serial backward's.
  - checkpoint bytes: what your forward still holds when it returns, counted from the moment it is called, at most
    (L/k + 1)·C + 1,024 = 328,704 bytes, where C = B·d·8 = 65,536 bytes is one [B, d] activation: the L/k
    checkpoints and y, plus 1 KiB for scalars and small bookkeeping. (Keeping x itself as the first checkpoint
    costs nothing: it is alive anyway.)
  - peak memory, at most W + G + 2·C + (L/k)·C + 2·C + k·A + 2·B·h·8 = 5,505,024 bytes:
      W = G = 2·L·d·h·8 = 1,048,576 bytes   the weights, and their gradients
      2·C                                   the inputs x and target
      (L/k)·C                               the checkpoints
      2·C                                   y, and grad_y
      A = B·(d + 2·h)·8 = 589,824 bytes     what autograd saves for one block (x @ w1, gelu(x @ w1), the output)
      k·A                                   one segment's recomputed activations
      2·B·h·8 = 524,288 bytes               the backward's temporaries (gradients of [B, h] activations)
    Without checkpointing the peak is about W + G/L + 2·C + L·A + ...: 10,977,288 bytes, measured.
  - compute, every op counted on the simulated GPU (matmuls by torch's formulas, an elementwise op one FLOP per
    element it writes, a reduction one per element it reads: README, "The clock"): at most the serial forward and
    backward plus one more forward, L·(2F + BK) + L·B·d = 270,532,608 FLOPs, where
      F = 4·B·d·h + B·h + B·d = 4,235,264 FLOPs   one block's forward: two matmuls of 2·B·d·h, gelu over the
                                                  [B, h] hidden layer, the residual add over [B, d]
      BK = 8·B·d·h + B·h + B·d = 8,429,568 FLOPs  its backward: four matmuls, gelu's backward, the two
                                                  gradients of its input added
      L·B·d = 131,072 FLOPs                       room for bookkeeping (one elementwise op per block's output)
    Recomputing a segment twice, or from the stack's input, goes over it. And at least the serial forward's and
    backward's matrix products, 3·L·4·B·d·h = 201,326,592 FLOPs of them in matmuls: a product written as
    elementwise multiplies and sums costs as many FLOPs, none of them products, and far more time.
  - memory is what your tensors hold: keep everything as torch tensors (the grader refuses a tensor turned into
    a numpy array, a Python list or bytes, which its ledger could not see).

Hints:
  - `with torch.no_grad():` runs code without recording the graph; `with torch.enable_grad():` turns it back on.
  - `c.detach().requires_grad_()` makes a fresh leaf that shares c's memory: recompute from it, and after
    `out.backward(g)` its `.grad` is the gradient to hand to the previous segment.
  - Drop each segment's graph and output before recomputing the next one (rebinding or `del`).
  - `with torch.profiler.record_function("recompute"):` around a recomputation shows it as such on the schedule.
"""

import torch

from puzzles.model import block, forward


def checkpointed_forward(x, layers, k):
    raise NotImplementedError("p1: write checkpointed_forward")


def checkpointed_backward(saved, layers, k, grad_y):
    raise NotImplementedError("p1: write checkpointed_backward")
