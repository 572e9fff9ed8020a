"""Puzzle 2 — Activation sharding.

The four ranks of a tensor-parallel group all compute the same stack on the same batch (each holds a slice of
every weight matrix, and they all-reduce after each block, so every rank ends each block with the same
activation). Here the ranks run the whole stack themselves, which gives the same picture: four ranks holding
four identical copies of every checkpoint of puzzle 1. That is waste. Each rank keeps a quarter of each
checkpoint (its rows), and the backward puts a checkpoint together again, with one all-gather, just before
recomputing its segment (DeepSpeed calls this `partition_activations`):

    forward (no graph), every rank:   c0 -> [b0..b3] -> c1 -> [b4..b7] -> c2 -> [b8..b11] -> c3 -> [b12..b15] -> y
    rank r keeps rows r·B/4 .. (r+1)·B/4 - 1 of c0, c1, c2, c3:

                  c0        c1        c2        c3
      rank 0:  [rows 0-63] [rows 0-63] ...               each rank: L/k shards of [B/4, d]
      rank 1:  [rows 64-127] ...
      rank 2:  [rows 128-191] ...
      rank 3:  [rows 192-255] ...

    backward, segment s = 3, 2, 1, 0:
      all_gather_into_tensor(full [B, d], my shard of c_s)   ->  c_s, whole, on every rank
      recompute the segment from it with autograd on, backpropagate, drop full and the graph

Write two functions (copy your puzzle 1 code and change what is kept and how it comes back):

  `sharded_forward(dist, x, layers, k) -> (saved, y)`
    - `x`: the batch, [256, 32], the same on every rank; `layers`: 16 pairs (w1 [32, 128], w2 [128, 32]) with
      requires_grad, the same on every rank; `k` = 4.
    - run every block without building the autograd graph; keep, of the input of blocks 0, k, 2k, ..., only this
      rank's rows `c.chunk(N)[rank]`, as a tensor of its own; return them with the output y [256, 32].

  `sharded_backward(dist, saved, layers, k, grad_y) -> grad_x`
    - as in puzzle 1, segment by segment, last first; each checkpoint is first all-gathered from the shards
      (`dist.all_gather_into_tensor(full, shard)`: every rank calls it, with its own shard).
    - every weight's gradient ends in its `.grad`; return the gradient of x.

Checks (sizes: N = 4 ranks, batch B = 256, d = 32, h = 128, L = 16 blocks, k = 4, float64 = 8 bytes;
C = B·d·8 = 65,536 bytes is one whole [B, d] activation):
  - on every rank: output and loss equal the serial model's; every weight's gradient and grad_x equal the serial
    backward's.
  - checkpoint bytes: what the forward still holds when it returns, counted from the moment it is called, at most
    (L/k)·C/N + C + 1,024 = 132,096 bytes per rank: the shards, a quarter of puzzle 1's checkpoints, and y, plus
    1 KiB for scalars and small bookkeeping.
  - gathered checkpoints: each time your backward communicates (an all-gather, or any other call on `dist`), what
    the rank holds beyond what it held when the backward began and the weights' gradients is at most
    4·C + 1,024 = 263,168 bytes: the checkpoint being gathered, the gradient handed down from the segment after
    it, and the previous segment's checkpoint and recomputed output on their way out. Keeping every gathered
    checkpoint until the end holds 5·C by the last gather. A backward that communicates nothing fails it: there
    was nothing to measure, and no checkpoint was gathered.
  - gathered in time: gather each checkpoint just before recomputing its segment. Counted in checkpoints' worth
    of bytes gathered against segments backpropagated, at most 2 gathered checkpoints wait for their segment at
    any gather (the one being recomputed, and the next if you prefetch it). Every message that brings the other
    ranks' rows counts, whatever call carries it (a checkpoint's worth is their (N-1)/N·C): gathering them all up
    front, however you put them together, has L/k = 4 waiting. And every checkpoint is gathered (the first may be
    x itself, which every rank has): a backward that gathers fewer than L/k - 1 fails, since a checkpoint never
    gathered was not gathered in time.
  - peak memory per rank, at most W + G + 2·C + (L/k)·C/N + 2·C + 2·C + k·A + 2·B·h·8 = 5,439,488 bytes:
      W = G = 2·L·d·h·8 = 1,048,576 bytes   the weights, and their gradients
      2·C                                   the inputs x and target
      (L/k)·C/N                             the checkpoint shards
      2·C                                   y, and grad_y
      2·C                                   gathered checkpoints
      A = B·(d + 2·h)·8 = 589,824 bytes     what autograd saves for one block
      k·A                                   one segment's recomputed activations
      2·B·h·8 = 524,288 bytes               the backward's temporaries
  - compute per rank, every op counted: at most puzzle 1's, the serial forward and backward plus one more forward,
    L·(2F + BK) + L·B·d = 270,532,608 FLOPs (F = 4·B·d·h + B·h + B·d = 4,235,264 a block's forward, BK =
    8·B·d·h + B·h + B·d = 8,429,568 its backward). Rebuilding the checkpoints from x instead of gathering them goes
    over it. And at least the serial forward's and backward's products, 3·L·4·B·d·h = 201,326,592 FLOPs of matmuls.
  - memory is what your tensors hold: keep everything as torch tensors (the grader refuses a tensor turned into
    a numpy array, a Python list or bytes, which its ledger could not see).

Hints:
  - `t.chunk(N)[r]` is a view: it keeps the whole of t's memory alive. `.clone()` it to keep only the rows.
  - `all_gather_into_tensor` concatenates the ranks' inputs along dim 0, rank 0's first: shard by rows.
  - `torch.empty(B, d, dtype=shard.dtype)` makes the buffer to gather into.
"""

import torch

from puzzles.model import block, forward


def sharded_forward(dist, x, layers, k):
    # BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = []
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x.chunk(world)[rank].clone())  # a tensor of its own: a view would keep all of x
            x = block(x, w1, w2)
    return saved, x
    # END SOLUTION


def sharded_backward(dist, saved, layers, k, grad_y):
    # BEGIN SOLUTION
    world = dist.get_world_size()
    grad = grad_y
    for s in reversed(range(len(saved))):
        shard = saved[s]
        full = torch.empty(shard.shape[0] * world, *shard.shape[1:], dtype=shard.dtype)
        dist.all_gather_into_tensor(full, shard)
        start = full.requires_grad_()
        with torch.enable_grad():
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)
        grad = start.grad
        del full, start, out  # the gathered checkpoint and the segment's graph go before the next gather
    return grad
    # END SOLUTION
