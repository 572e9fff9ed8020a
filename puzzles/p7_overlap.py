# Generated from solutions/p7_overlap.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest 00f023cfc513)
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
  - compute: 1,024 FLOPs per tick; only matmuls cost FLOPs (a [8, 64] @ [64, 256] matmul: 2·b·d·h = 262,144 FLOPs
    = 256 ticks). A block's forward is 2 matmuls = 512 ticks; its backward 4 matmuls = 1,024 ticks (block 0: 3
    matmuls = 768 ticks, since the batch itself needs no gradient).
  - communication: latency alpha = 8 ticks per ring step, bandwidth 512 bytes per tick; an all-reduce of n bytes
    over N ranks costs 2(N-1)·alpha + 2(N-1)/N·n/512 ticks. One weight's gradient (d·h·8 = 131,072 bytes) takes
    432 ticks; one block's two gradients (2·d·h·8 = 262,144 bytes) take 816 ticks: a bit less than a block's
    backward, so each block's communication can hide behind the next block's backward.
  - the communication stream is separate from the compute stream: an async op runs on it while compute goes on,
    and `work.wait()` makes the compute stream wait for it. Ops on the communication stream run one at a time.

Checks:
  - updated weights: every rank's weights equal one SGD step of the serial model on the whole batch.
  - averaged gradients: after the step, every rank's `w.grad` holds the all-reduced gradient: the average over the
    ranks, or their sum when the learning rate does the dividing (`w -= lr / N * w.grad`).
  - hooks removed: the hooks the step registered are gone when it returns. The grader runs a backward through
    each weight after your step and sees whether any hook still fires (it stops the hook before its first line).
  - compute: each rank computes at most its 1/N share of the serial step, 12·b·d·h·L = 6,291,456 FLOPs, and at
    least 6,029,312 (as in puzzle 3: its own rows only, with matmuls).
  - communication: the bytes each rank sends, at most those of an all-reduce of every gradient,
    2(N-1)/N·G + 1,024 = 1,573,888 bytes (G = 2·L·d·h·8 = 1,048,576 bytes; each gradient once, alone or in
    buckets, by all-reduces or by reduce-scatters and all-gathers; 1 KiB of room for scalars).
  - makespan: at most C + A + T = 6,998 ticks, where
        C = 5,888 ticks, the compute of the step: forward 4·b·d·h·L + backward (8L-2)·b·d·h = 6,029,312 FLOPs
            over 1,024 FLOPs per tick (exact: nothing is recomputed);
        A = 816 ticks, one block's gradient all-reduce: 2(N-1)·alpha + 2(N-1)/N·(2·d·h·8 bytes)/512;
        T = 294 ticks of tolerance, 5% of C (queueing between all-reduces, buckets of another size).
    Synchronous all-reduces after backward take C + 2L·432 = 9,344 ticks: compute plus all the communication.
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
