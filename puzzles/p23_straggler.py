# Generated from solutions/p23_straggler.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest 4b4655ae38dd)
"""Puzzle 23 — The straggler: one slow rank, found by timing, and the work rebalanced.

The task: `train_balanced` below, as handed to you, trains correctly, but one rank's GPU is slower than the others
and every step waits for it. Find which rank it is from the per-rank timings (the check's table; the trace,
`python -m grader check puzzles -p p23 --trace p23.json`, opened in Perfetto), then fix the program so that it
finds the slow rank itself, at run time, and gives each rank rows in proportion to its speed. Which rank is slow
changes with the seed (`--seed N`), as it does from one job to the next on a real cluster: a fix that names the
rank fails at another seed. The checks (4 ranks; S = 4 steps of data parallel SGD, lr = 0.01, each on a global
batch of B = 88 rows; L = 2 blocks, d = 64, h = 256; one rank's device K = 3/2 times as slow as the others', for
every op):
  - weights: every rank's weights after the S steps equal S SGD steps of the serial model, each on its step's
    whole batch, the loss averaged over its 88 rows (float64, 1e-8 relative).
  - every row once: at each step, each of the batch's 88 rows is read by exactly one rank (`batch[lo:hi]`; the
    batch notes which rows each rank reads): no row dropped, none read by two ranks.
  - communication: the bytes each rank sends, at most S·2(N-1)/N·G + 1 KiB = 4 x 786,432 + 1,024 = 3,146,752
    bytes (G = 2·L·d·h·8 = 524,288 bytes, each step's gradients once; 1 KiB for scalars such as the timings).
  - balance: the ticks any rank's device sits idle waiting in its collectives for the last rank to arrive, at
    most 20% of S·C = 8,788 (C below): a rank given more work than its speed allows makes the others wait; one
    given less waits itself (an async all-reduce that waits while the rank still computes costs nothing).
  - makespan: the whole run, at most P + S·(C + A) + T = 4,611 + 4 x (10,986 + 1,584) + 2,197 = 57,088 ticks,
    where C = 10,986 ticks is the balanced step on the slow rank (its 16 rows' forward and backward, the loss
    weighed by 16/B, the update, each op K times as long), A = 1,584 the gradients' all-reduce (6 x 8 + 786,432 /
    512), P = 4,611 a probe (a forward and backward on 8 rows, on the slow rank) and T = 5% of S·C = 2,197. The
    program as handed out takes 63,968 ticks; the reference, 55,515.

The symptom, as a real job shows it: the step time in the log is a quarter longer than it was yesterday, on the
same code and data, and nothing fails. Every rank's profile (torch.profiler, each rank's trace side by side) shows
the same all-reduce kernels, but on all ranks but one they are long: they started early and waited for a partner
(NCCL's kernel spins until the last rank arrives). The one rank whose all-reduce is short is the one the others
wait for; its compute kernels take longer than the same kernels elsewhere (a GPU throttled by heat or power, a
slower part, a noisy neighbour on its host). NCCL_DEBUG=INFO shows nothing wrong, and the flight recorder, dumped
at a step, shows every rank's all-reduce "started" on all ranks but the slow one, still computing. One step of the
program as handed out, in the shape the trace shows it (not to scale; rank 2 slow, at some seed):

    rank 0   |F   B    |.....waits.....|AR|U|
    rank 1   |F   B    |.....waits.....|AR|U|
    rank 2   |F      B                 |AR|U  |   the same 22 rows, each op K = 3/2 times as long
    rank 3   |F   B    |.....waits.....|AR|U|

Balanced, each rank's compute takes as long as the others': 24 rows on each fast rank, 16 on the slow one.

The fix: time each rank's device with the tools a GPU has, **CUDA events**: `cuda.Event(enable_timing=True)`,
`start.record()` before the work and `end.record()` after it, `end.synchronize()`, then `start.elapsed_time(end)`
in milliseconds of the device's own time (not the host's, which runs ahead of the device). Here `cuda` is
`puzzles.sim.cuda`, torch.cuda's mirror: on a simulated rank it reads the rank's clock (a tick is a nanosecond),
so the slow rank measures K times as long; on a GPU write `from torch import cuda`, the same code. Time a short
probe on rows of your own (`torch.zeros`: the batch's rows are every rank's, and a row read is a row taken),
all-gather the times (every rank then computes the same split), and give each rank rows in proportion to 1/time,
rounded so that the counts add up to B. Then each rank's rows are its share of the batch, and shares of different
sizes must be weighed by their size: the batch's mean loss is Σ_r (n_r/B)·mean_r, so each rank's loss is its
mean times n_r/B and the gradients are summed (SUM), not averaged (a mean of means weighs the slow rank's rows
more than the others').

Write `train_balanced(dist, batches, layers, lr)`:
  - `batches`: the S steps' global batches, the same on every rank, each of B = 88 rows: `batch[lo:hi]` gives
    (x [hi-lo, 64], target [hi-lo, 64]), rows lo..hi-1; len(batch) is B;
  - `layers`: the rank's replica of the weights, [(w1 [64, 256], w2 [256, 64])] x 2, requires_grad;
  - for each step: this rank's rows' share of the loss (`loss_fn(forward(x, layers), target)` weighed by its
    share), its gradients summed over the ranks, one SGD step (`w -= lr * w.grad` under torch.no_grad(), every
    weight, every rank), `w.grad` cleared for the next step.

The simulated machine: the puzzles' GPU, one rank's K = 3/2 times as slow (the cost model's slow_ranks, from the
seed); puzzle 8's network, alpha = 8 ticks per ring step, 512 bytes per tick.

Hints:
  - `times = torch.empty(world, dtype=torch.float64)` and `dist.all_gather_into_tensor(times, mine)`, with
    `mine = torch.tensor([start.elapsed_time(end)], dtype=torch.float64)`: every rank's probe time.
  - `exact = B * (1 / times) / (1 / times).sum()`; round down, then give the rows left over to the ranks rounded
    down most; the running sum of the counts gives each rank's `lo` and `hi`.
"""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import cuda

PROBE = 8  # rows of the probe that times each rank's device


def train_balanced(dist, batches, layers, lr):
    raise NotImplementedError("p23: every step waits for one rank: delete this line to run it as handed out, then fix it")
    world, rank = dist.get_world_size(), dist.get_rank()
    weights = [w for pair in layers for w in pair]
    per = len(batches[0]) // world  # an even split: 22 rows each
    for batch in batches:
        x, target = batch[rank * per:(rank + 1) * per]
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        for w in weights:
            dist.all_reduce(w.grad)
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
