"""Puzzle 20 — The hang: a collective timeout, read with the flight recorder.

The task: `train_step` below, as handed to you, hangs. Find out why with the flight recorder, and fix it so that
every rank makes the same collective calls whatever its data, and the step is the one a single GPU would take on
the whole batch. The checks (4 ranks; two runs, A and B, of 4 steps each on fresh weights; L = 2 blocks, d = 32,
h = 64; 8 rows per rank and step):
  - weights after each step: every rank's weights after each step of both runs equal one SGD step (lr = 0.05) of
    the serial model on the whole batch, whose loss is the squared error averaged over the *real* rows of every
    rank (float64, 1e-8 relative).
  - logged losses: what `train_step` returns, on every rank, equals that loss at the weights before the step.
  - communication: the bytes each rank sends, at most k·2(N-1)/N·G + 1 KiB = 8 x 98,304 + 1,024 = 787,456 bytes
    (k = 8 steps, each one all-reduce of the gradients, G = 2·L·d·h·8 = 65,536 bytes; 1 KiB for scalars such as a
    count of rows or the loss).
  - compute: the FLOPs each rank computes, at most 1.5·k·12·L·d·h·r = 1.5 x 8 x 12 x 2 x 32 x 64 x 8 = 4,718,592
    (a forward and backward, 12·L·d·h FLOPs a row, on the rank's own r = 8 rows at each step, padding included,
    and half as much again): each rank computes its own share, not the whole batch's.
  - no hang: the job's collective timeout is 1,000,000 ticks (1 ms: init_process_group(timeout=...)). A run that
    hangs fails at its timeout; a longer one only waits longer, so the timeout is not what to change.

The symptom, as a real job shows it. Ten minutes after the last line of its log, every rank but one prints:

    [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=13, OpType=ALLREDUCE, NumelIn=2048,
    NumelOut=2048, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.

and the job dies. The message names the collective each rank waited in, never why the partner did not come.
Three tools tell more: TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective's shapes across ranks before it
runs (a mismatch is an error at once, naming both sides); NCCL_DEBUG=INFO logs each communicator's calls; and the
**flight recorder** (TORCH_FR_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1) keeps each rank's last collectives
(sequence number, group, op, sizes, state: scheduled, started, completed, and the Python stack) and dumps them when
the watchdog fires; `python -m torch.distributed.flight_recorder.fr_trace <dumps>` reads them side by side and names
the first collective at which the ranks part ("Not all ranks joining collective, sequence number: 13", with the
missing ranks, or "Collective sequence number: 13 has errors": another op, other sizes).

Here, the simulator is that job: its timeout is on the simulated clock, and when the run hangs, the error holds
each waiting rank's watchdog line, the flight recorder's analysis, and each rank's last records, with the line of
your code that made each call and the step the harness was in (`record_function("run A step 2")`, which the
records carry). Delete the first line of `train_step` (the stub's), run `python -m grader check puzzles -p p20`,
and read. Two seeds put the trouble at different ranks and steps (`--seed N`): the fault moves with the data.

The data. Each step, every rank holds 8 rows of the global batch; `valid` marks the real ones (the rest is
padding: a sequence packed short, a shard that ran out). The loss averages over the real rows of the whole batch:

    loss = Σ_{real rows i, every rank} ‖f(x_i) - t_i‖² / n        n = the real rows of every rank, together

so a rank's gradient is its real rows' share of that sum, divided by the same n on every rank, and the ranks'
shares add up (all-reduce, SUM) to the gradient of the whole batch. A rank with no real row has a share of zero:
it still has to add it. Some rank has no real row at some step of each run, and the ranks' counts of real rows
differ. The step runs microbatches of at most MICRO = 4 rows (to bound the activations' memory).

The classic ways ranks part (what the flight recorder shows for each):
  - a data-dependent branch, a rank that skips a step when its batch is empty: it leaves out the collectives of
    that step (the others' next collective finds it at a later one: "not all ranks joining", or other sizes);
  - a rank-dependent loop count: a collective inside a loop whose length depends on the rank's data (DDP without
    `no_sync()` all-reduces after *every* backward, so a rank with one microbatch more makes one all-reduce more);
  - an exception caught on one rank, a rank that returns early, a collective under `if rank == 0`.
The fix is never to make the ranks agree by doing less (every rank skipping a step, dropping the rows beyond the
fewest microbatches): the weights then are not the whole batch's step. It is to make every rank make the same
calls: its share of the gradient, whatever its data, in one all-reduce per step.

Write `train_step(dist, x, target, valid, layers, lr)`:
  - `x`, `target`: this rank's 8 rows of the step, [8, 32] each; `valid`: a bool [8], True for the real rows;
  - `layers`: the rank's replica of the weights, [(w1 [32, 64], w2 [64, 32])] x 2, requires_grad, their `.grad`
    None when the step starts;
  - take one SGD step on the loss above (`w -= lr * w.grad` under torch.no_grad(), on every weight, every rank)
    and return the loss (a tensor of one number, the same on every rank).
The harness calls it for each step of run A, then of run B, inside `record_function(f"run {run} step {s}")`.

The simulated machine (for the timeline; no time budget): the puzzles' GPU and puzzle 8's network, alpha = 8
ticks per ring step, 512 bytes per tick: an all-reduce of the 65,536 bytes of gradients over 4 ranks costs
6 x 8 + 96 = 144 ticks.

Hints:
  - `torch.tensor(float(n))` then `dist.all_reduce(...)` counts the real rows of every rank; divide each rank's sum
    of squared errors by that one number.
  - `loss.backward()` adds each microbatch's gradient into `w.grad`: all-reduce once, after the last microbatch.
  - A rank with no real row has `w.grad` None after its (empty) loop: `torch.zeros_like(w)` is its share.
"""

import torch

from puzzles.model import forward, loss_fn

MICRO = 4  # rows per microbatch


def train_step(dist, x, target, valid, layers, lr):
    # BEGIN SOLUTION
    rows, targets = x[valid], target[valid]  # this rank's real rows
    n = torch.tensor(float(rows.shape[0]), dtype=torch.float64)
    dist.all_reduce(n)  # every rank's real rows: the loss is their mean
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, rows.shape[0], MICRO):  # as many microbatches as this rank has: no collective inside
        xm, tm = rows[start:start + MICRO], targets[start:start + MICRO]
        loss = ((forward(xm, layers) - tm) ** 2).sum() / n  # this microbatch's share of the global loss
        loss.backward()  # adds into w.grad
        total += loss.detach()
    weights = [w for pair in layers for w in pair]
    for w in weights:
        if w.grad is None:  # no real row here: a share of zero, which every other rank waits for
            w.grad = torch.zeros_like(w)
        dist.all_reduce(w.grad)  # once per step, on every rank
    dist.all_reduce(total)
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total
    # END SOLUTION
    # BEGIN HANDED OUT: this step hangs
    # world = dist.get_world_size()
    # rows, targets = x[valid], target[valid]  # this rank's real rows (the padding left out)
    # if rows.shape[0] == 0:
    #     return None  # nothing to learn from on this rank
    # weights = [w for pair in layers for w in pair]
    # total = torch.zeros((), dtype=torch.float64)
    # for start in range(0, rows.shape[0], MICRO):  # microbatches, to bound the activations' memory
    #     xm, tm = rows[start:start + MICRO], targets[start:start + MICRO]
    #     loss = loss_fn(forward(xm, layers), tm) * xm.shape[0] / rows.shape[0]  # this rank's mean, in parts
    #     grads = torch.autograd.grad(loss, weights)
    #     for w, g in zip(weights, grads):
    #         dist.all_reduce(g)  # averaged as each microbatch's backward ends, as DDP does
    #         g /= world
    #         w.grad = g if w.grad is None else w.grad + g
    #     total += loss.detach()
    # dist.all_reduce(total)  # the loss, for the log
    # with torch.no_grad():
    #     for w in weights:
    #         w -= lr * w.grad
    # return total / world
    # END HANDED OUT
