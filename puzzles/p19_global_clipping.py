# Generated from solutions/p19_global_clipping.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest bc1b835aeb0c)
"""Puzzle 19 — Numerics under sharding: global gradient clipping and non-finite steps.

The task: write `ClippedShardedAdam`, puzzle 8's ZeRO-2 Adam for a model split across a tensor-parallel pair, with
two things every long training run needs: clip the gradients by their *global* norm (torch's clip_grad_norm_ on the
whole model, though no rank holds the whole gradient), and when any rank's gradient holds an inf or a NaN, skip
the step on *every* rank alike. step() returns the norm. The checks, with their numbers (4 ranks; Ψ_r = 8,320
parameters per rank, its shard Ψ_r/D = 4,160):
  - weights after each step: every rank's parameters after each of 5 steps equal torch.nn.utils.clip_grad_norm_
    (max_norm = 100) and torch.optim.Adam on the serial model, steps 3 and 5 skipped (float64, 1e-8 relative).
  - global norm: what step() returns, on every rank, equals the serial clip_grad_norm_'s return value (the norm
    before clipping; measured at your own weights before the step), and is not finite at a faulty step.
  - skipped steps: at steps 3 and 5, and at step 1 of a second run, no rank changes its weights or anything its
    optimizer keeps (m, v, a master copy). Nor does a skipped step count in Adam's t: the weights after step 4
    show it.
  - communication: the bytes your optimizer sends, at most k·2(D-1)/D·8·Ψ_r + 1 KiB = 7 x 66,560 + 1,024 = 466,944
    (k = 7 steps in all, each a reduce-scatter of the gradients and an all-gather of the weights: the norm and
    the skip cost only a few scalars on top). The harness's own all-reduces (the model's forward) do not count.
  - optimizer state: at most (8 + 8 + 8 + 1)·Ψ_r/D + 1 KiB = 105,024 bytes between steps: master, m and v for
    your 1/D shard (99,840 bytes), a byte per element for a mask of the replicated ones if you want one, scalars.

The layout (Megatron's order: tensor-parallel neighbours, then data-parallel replicas; rank = tp + 2·dp):

                 replica 0 (rows 0-7)          replica 1 (rows 8-15)
    pair      [ rank 0 | rank 1 ]           [ rank 2 | rank 3 ]        tensor-parallel pairs [0, 1], [2, 3]
    holds       cols 0-63 | 64-127            cols 0-63 | 64-127       data-parallel pairs   [0, 2], [1, 3]

Each of the L = 2 blocks is a pre-norm MLP with an output bias (d = 32, h = 128):

    y = x + gelu(rms_norm(x, norm) @ w1) @ w2 + bias          norm, bias: [d]    w1: [d, h]    w2: [h, d]

w1's columns and w2's rows are split across the pair (puzzle 4: rank tp holds w1[:, 64·tp : 64·tp + 64] and
w2[64·tp : 64·tp + 64, :]); the norm's scale and the bias are *replicated*: both ranks of a pair hold them whole
and, since f's all-reduce in backward gives both ranks the whole input gradient, compute the same gradient for
them. Each rank's parameters, in the order `params` lists them:

    layers[0].norm [32]  layers[0].w1 [32, 64]  layers[0].w2 [64, 32]  layers[0].bias [32]  layers[1].norm ... bias
    replicated           split                  split                  replicated           (Ψ_r = 8,320 numbers)

ZeRO-2 over the data-parallel pair, as in puzzle 8: flatten the rank's parameters in that order, cut the vector in
D = 2 halves, and keep the master copy, m and v of half dp only (here each half is exactly one block's parameters).

The global norm. clip_grad_norm_ scales every gradient by min(1, max_norm / (‖g‖ + 1e-6)), where ‖g‖ is the norm
of the whole model's gradient, all parameters as one vector. After the reduce-scatter, each rank holds the
averaged gradient of its shard; ‖g‖² is the sum of every rank's squares, each parameter counted once:

    sharded parameters   (w1, w2)      one copy in the world for each element: add every rank's squares
    replicated           (norm, bias)  one copy on each rank of the pair: count them once, not T = 2 times

    rank r:  s_r = Σ (its shard's sharded elements)² + Σ (its replicated elements)² / T
             all_reduce(s_r) over the pair, then over the data-parallel group (or once over all 4 ranks)
             ‖g‖ = sqrt(Σ s_r), the same number on every rank: clip, Adam on the shard, all-gather

(Megatron's clip_grads counts a replicated parameter on tensor-parallel rank 0 only, and finds an inf or a NaN by a
test of its own over every gradient, a flag all-reduced over every rank; dividing by T counts it once too, and lets
either copy's inf or NaN into the norm.) One number per rank goes over the network, not a gradient: a rank's norm of its
own shard alone (a local norm) clips every rank by a different factor, and counting the replicated parameters once
per copy makes the norm too large (here by about 1%: enough to change every clipped step).

Non-finite steps. An inf or a NaN anywhere makes ‖g‖² inf or NaN, and the all-reduce carries it to every rank: so
the all-reduced norm is also the test. When it is not finite, every rank skips: no clipping, no update, no
all-gather, Adam's step count unchanged (as GradScaler skips optimizer.step()), and returns the norm it found. A
rank that decides from its own shard alone skips while the others step: their weights part, and a rank that
returns before a collective the others are in leaves them waiting (on a cluster the job hangs; the simulator stops
the run and says which rank went ahead).

The faults (how the grader injects them): after backward and before step(), the harness writes a value into one
entry of one rank's gradient:

    step 3   NaN into rank 1's layers[1].w1.grad[0, 0]    the reduce-scatter carries it into rank 3's shard
                                                          (layers[1] is replica 1's half): rank 1 hands it on,
                                                          rank 3 finds it, ranks 0 and 2 never see it
    step 5   inf into rank 3's layers[0].bias.grad[0]     a replicated parameter, on one copy only (rank 2's is
                                                          finite); it lands in rank 1's shard: a norm that counts
                                                          replicated parameters on one rank of the pair only
                                                          misses it, while every rank must still skip
    second run, on a fresh optimizer over batches 1 and 2:
    step 1   NaN into rank 2's layers[1].w2.grad[0, 0]    (so a skip tied to the step's number fails)

The batches: 16 rows a step (8 per replica), the targets of steps 2, 3 and 5 four times larger, so that the
gradient's norm is above max_norm at step 2 (clipped) and below it at steps 1 and 4 (left alone): over 1,000 seeds,
109.7 and more against 70.6 and less.

Write the class `ClippedShardedAdam`:
  - `ClippedShardedAdam(dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm)`: `params`, this
    rank's 8 parameters in the order above (float64, requires_grad); `replicated`, a list of 8 bools (True for the
    norms and the biases); `tp_group` and `dp_group`, the rank's two process groups (made by the harness:
    `dist.get_rank(group)` and `dist.get_world_size(group)` say where it sits in them). Keep, for this rank's
    shard only, a float64 master copy of the parameters and Adam's m and v (zeros).
  - `step()`: called after backward, with each parameter's gradient of this replica's rows in `p.grad` (the loss
    is a mean over rows: the full-batch gradient is the average over the data-parallel pair). Reduce-scatter the
    flat gradient over `dp_group` and average; the global norm as above; if it is not finite, return it (the
    step skipped on every rank); else multiply the shard by min(1, max_norm / (norm + 1e-6)), update it with Adam
    exactly as torch.optim.Adam does (no weight decay, bias-corrected, t = the steps taken), all-gather the
    shards over `dp_group` and copy them into the parameters in place. Return the norm (a float or a tensor of one
    element), before clipping, as clip_grad_norm_ does. Free the flat gradient and gathered buffer before returning.
The harness runs 5 steps (forward and backward on the replica's 8 rows, the fault if this is its step and rank,
step(), then p.grad = None), then the second run of 2 steps on a fresh optimizer. lr = 0.01, betas = (0.9, 0.999),
eps = 1e-8, max_norm = 100.

The simulated machine (for the timeline; no time budget): the puzzles' GPU (README, "The clock") and puzzle 8's
network, alpha = 8 ticks per ring step, 512 bytes per tick: the reduce-scatter or all-gather of 66,560 bytes over a
pair costs 8 + 65 = 73 ticks, a scalar's all-reduce 2 x 8 + 1 = 17 ticks (its latency is nearly all it costs).

Checks, in detail:
  - weights: rank r's parameters after each step against its slices of the serial parameters after that step
    (torch.nn.utils.clip_grad_norm_(params, 100) then torch.optim.Adam.step(), steps 3 and 5 not taken).
  - norm: the serial norm is computed at your own weights before the step (the pair's slices put together), so a
    wrong norm is told apart from a wrong update.
  - skipped steps: around step() at each faulty step, every tensor your optimizer object holds (walked through its
    attributes, lists and dicts) of more than one number, and the parameters: bit for bit unchanged on every rank.
  - communication: wire bytes of the ring algorithm, every collective your code calls (sends included).
  - optimizer state: the bytes your rank holds after each step (gradients freed) beyond what it held before your
    optimizer was made.

Hints:
  - `dist.reduce_scatter_tensor(out, inp, group=dp_group)` and `dist.all_gather_into_tensor(out, inp,
    group=dp_group)` as in puzzle 8, on the pair's group; `dist.all_reduce(s, group=...)` sums a tensor of one
    number in place.
  - Which elements of your shard are replicated follows from the parameters' sizes: the shard is elements
    dp·Ψ_r/D to (dp+1)·Ψ_r/D of the flat vector, and each parameter covers a range of it.
  - `torch.isfinite(norm)` is False for inf and NaN alike (torch.isnan misses an inf).
"""

import torch


class ClippedShardedAdam:
    def __init__(self, dist, params, replicated, tp_group, dp_group, lr, betas, eps, max_norm):
        raise NotImplementedError("p19: write ClippedShardedAdam.__init__")

    def step(self):
        raise NotImplementedError("p19: write ClippedShardedAdam.step")
