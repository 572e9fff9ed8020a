# Generated from solutions/p7_overlap.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest a7ec556916ed)
"""Puzzle 7 — Overlapping communication with backward.

In puzzle 3 every rank ran its whole backward pass, and only then all-reduced the gradients: the links sat idle
during backward and the compute sat idle during the all-reduces, so one step took compute + all communication.
But backward produces the gradients one block at a time, last block first, and the gradient of block 3 is final
long before block 0's backward is done. Send it right away, asynchronously, and keep computing: the all-reduce of
block 3's gradients runs on the communication stream while block 2's backward runs on the compute stream.

    synchronous (puzzle 3):
      compute |==fwd 0..3==|== bwd 3 ==|== bwd 2 ==|== bwd 1 ==|= bwd 0 =|                        |
      comm    |                                                            |AR 3 |AR 2 |AR 1 |AR 0|
                                                           makespan = compute + all communication ^

    overlapped (this puzzle):
      compute |==fwd 0..3==|== bwd 3 ==|== bwd 2 ==|== bwd 1 ==|= bwd 0 =|     |
      comm    |                        |AR 3 |     |AR 2 |     |AR 1 |   |AR 0 |
                                    makespan = compute + about one block's all-reduce ^
                                                             (wait for every handle, then update)

Write `overlapped_step(dist, x_shard, target_shard, layers, lr)`, one data-parallel SGD step exactly like
puzzle 3, but with the communication hidden behind backward:
  - `x_shard`, `target_shard`: this rank's 8 rows of the batch, [8, 64] each;
  - `layers`: this rank's replica of the weights, a list of 4 pairs (w1 [64, 256], w2 [256, 64]) with requires_grad;
  - compute `loss_fn(forward(x_shard, layers), target_shard)` (from puzzles.model) and backpropagate;
  - as soon as backward has produced a gradient, launch its all-reduce with `async_op=True` (it returns a work
    handle) and let backward carry on;
  - after backward, `wait()` on every handle, average (the all-reduce sums; divide by `dist.get_world_size()`),
    and update every weight in place: `w -= lr * w.grad` under `torch.no_grad()`.

The simulated machine (sizes: 4 ranks, batch 32 so b = 8 rows per rank, d=64, h=256, L=4 blocks):
  - compute: the puzzles' GPU (README, "The clock"): every op costs max(FLOPs / 1,024, bytes / 2,048) + 4 ticks.
    A [8, 64] @ [64, 256] matmul (2·b·d·h = 262,144 FLOPs) takes 260 ticks; a gelu over [8, 256] 20 ticks and a
    residual add over [8, 64] 10, bound by memory. A block's forward is 550 ticks, its backward 1,078 (block 0:
    808, since the batch itself needs no gradient), the loss 65 both ways: FB = 6,307 ticks for the forward and
    backward. The update is bound by memory too: each [64, 256] weight is averaged in place (132 ticks), its
    gradient scaled by lr (132) and subtracted (196): U = 8·460 = 3,680 ticks.
  - communication: latency alpha = 8 ticks per ring step, bandwidth 512 bytes per tick; an all-reduce of n bytes
    over N ranks costs 2(N-1)·alpha + 2(N-1)/N·n/512 ticks. One weight's gradient (d·h·8 = 131,072 bytes) takes
    432 ticks; one block's two gradients (2·d·h·8 = 262,144 bytes) take 816 ticks: a bit less than a block's
    backward, so each block's communication can hide behind the next block's backward.
  - the communication queue is separate from the compute stream: an async op runs on it while compute goes on,
    and `work.wait()` makes the compute stream wait for it. Collectives on the queue run one at a time, in the
    order the rank issued them.

Checks:
  - updated weights: every rank's weights equal one SGD step of the serial model on the whole batch.
  - averaged gradients: after the step, every rank's `w.grad` holds the all-reduced gradient: the average over the
    ranks, or their sum when the learning rate does the dividing (`w -= lr / N * w.grad`).
  - hooks removed: the hooks the step registered are gone when it returns. The grader runs a backward through
    each weight after your step and sees whether any hook still fires (it stops the hook before its first line).
  - compute: as in puzzle 3, at most FB + 3Ψ + L·b·d = 6,447,632 FLOPs (its own rows, and the update of every
    weight), and at least 6,029,312 FLOPs of matmuls.
  - communication: the bytes each rank sends, at most those of an all-reduce of every gradient,
    2(N-1)/N·G + 1,024 = 1,573,888 bytes (G = 2·L·d·h·8 = 1,048,576 bytes; each gradient once, alone or in
    buckets, by all-reduces or by reduce-scatters and all-gathers; 1 KiB of room for scalars).
  - makespan: the communication left exposed, makespan - min(work, 1.25·C), at most A + T = 1,315 ticks, where
        C = FB + U = 6,307 + 3,680 = 9,987 ticks, the compute of the step (nothing recomputed);
        work is the busiest rank's compute stream, counted up to 1.25·C (your style's own copies, say a
            bucket's, do not count against your overlap; extra work beyond that hides nothing), less the ticks
            that ran while one of its messages was in flight and that no arithmetic explains: an op counts as
            far as its FLOPs at the peak rate and an elementwise op's memory traffic (3 float64 operands per
            FLOP) account for its time, so copies or clones run while a message is in flight hide nothing;
        A = 816 ticks, one block's gradient all-reduce: 2(N-1)·alpha + 2(N-1)/N·(2·d·h·8 bytes)/512;
        T = 499 ticks of tolerance, 5% of C (queueing between all-reduces, buckets of another size).
    Synchronous all-reduces after backward leave all of it exposed: 2L·432 = 3,456 ticks.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - `w.register_post_accumulate_grad_hook(hook)` calls `hook(w)` inside backward, right after `w.grad` has been
    written: the moment to launch its all-reduce. It returns a handle: keep it, and `.remove()` every hook before
    returning (a hook left on a weight fires again in the next step's backward).
  - Keep the work handles in a list; don't wait inside the hook (that stalls backward until the message is done).
  - Don't touch a gradient while its all-reduce is in flight (dividing it, say): wait first.
"""

import torch

from puzzles.model import forward, loss_fn


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    raise NotImplementedError("p7: write overlapped_step")
