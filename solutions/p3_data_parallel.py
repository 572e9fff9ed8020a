"""Puzzle 3 — Data parallel.

Four ranks each hold a full copy of the weights and a quarter of the batch. Each computes the loss on its own
rows and backpropagates, so its gradients are the gradients of *its* quarter. To take the step one device would
take on the whole batch, the ranks must agree on the gradient of the whole batch. The loss is a *mean* over the
rows, so that gradient is the *average* of the four local gradients (each quarter holds a quarter of the rows):

    rank 0: rows  0-7   --forward/backward-->  g0 --+
    rank 1: rows  8-15  --forward/backward-->  g1 --+-- all_reduce --> (g0+g1+g2+g3)/4 on every rank --> w -= lr * g
    rank 2: rows 16-23  --forward/backward-->  g2 --+
    rank 3: rows 24-31  --forward/backward-->  g3 --+

Write `data_parallel_step(dist, x_shard, target_shard, layers, lr)`:
  - `x_shard`, `target_shard`: this rank's 8 rows of the batch, [8, 64] each;
  - `layers`: this rank's replica of the weights, a list of 4 pairs (w1 [64, 256], w2 [256, 64]) with requires_grad;
  - compute `loss_fn(forward(x_shard, layers), target_shard)` (from puzzles.model), backpropagate, average every
    gradient across the ranks with `dist.all_reduce`, in `w.grad` itself, and update every weight in place:
    `w -= lr * w.grad` under `torch.no_grad()`.

Checks (sizes: 4 ranks, batch B = 32 so b = 8 rows per rank, d=64, h=256, L = 4 blocks):
  - updated weights: every rank's weights equal one SGD step of the serial model on the whole batch.
  - averaged gradients: after the step, every rank's `w.grad` holds the gradient of the whole batch, the average
    of the ranks' gradients, where an optimizer reads it. (Averaging the *weights* after a local step gives the
    same weights for one plain SGD step, but not the gradients, and not the step of momentum or Adam.)
  - compute, every op counted on the simulated GPU (README, "The clock"): each rank computes at most its forward
    and backward on its own rows, FB = 6,052,368 FLOPs, 1/N of the serial step's (per block 2 forward and 4
    backward matmuls of 2·b·d·h, gelu and the residual add and their backward; the loss on its rows), plus the
    update of every weight, 3Ψ = 393,216 FLOPs (Ψ = 2·L·d·h weights, each averaged, scaled by lr and subtracted:
    every rank updates all of them), and L·b·d = 2,048 for bookkeeping: FB + 3Ψ + L·b·d = 6,447,632 FLOPs. Running
    the whole batch on every rank is about 4 times that. And at least 6,029,312 FLOPs of matrix products, its
    rows' matmuls without the batch's own gradient (which nobody needs): a product written as elementwise
    multiplies and sums costs as many FLOPs, none of them products.
  - communication: the bytes each rank sends, summed over every collective (ring algorithm), at most those of an
    all-reduce of every gradient, 2(N-1)/N·G + 1,024 = 1,573,888 bytes, where G = 2·L·d·h·8 = 1,048,576 bytes
    are the gradients and 1 KiB is room for scalars such as a logged loss. One all-reduce per gradient, or flat
    buckets, or a reduce_scatter_tensor followed by an all_gather_into_tensor (which send the same bytes) all fit.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - `dist.all_reduce(t)` sums in place; `dist.all_reduce(t, op=dist.ReduceOp.AVG)` averages (or divide the sum by
    `dist.get_world_size()`).
  - Gradients live in `w.grad` after `loss.backward()`.
"""

import torch

from puzzles.model import forward, loss_fn


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    # BEGIN SOLUTION
    loss = loss_fn(forward(x_shard, layers), target_shard)
    loss.backward()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w.grad /= world
                w -= lr * w.grad
    # END SOLUTION
