# Generated from solutions/p17_zero_bubble.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest e6858de05856)
"""Puzzle 17 — Zero-bubble pipeline (ZB-H1): the backward split in two.

The task, and its budgets (puzzle 6's pipeline: p = 4 ranks, 2 blocks each, m = 8 microbatches):
  - bubble: the last stage idles at most (p-1)·max(F, B, F + B - W) + B/2 = 3,906 ticks, under a third of
    1F1B's (p-1)·(F + BW) = 12,120;
  - activation memory on every rank at most 1F1B's on rank 0 (p microbatches) and the p stage inputs it
    received: p·A + p·mb·d·8 + d·h·8 + A/2 = 479,232 bytes;
  - each input gradient sent before its microbatch's weight gradients are computed;
  - the weight gradients exactly the serial ones, and compute at most m·(F + B + W) per stage.

A stage's backward computes two things: the gradient of its input, which the stage before it waits for, and
the gradients of its own weights, which nobody needs before the optimizer step. 1F1B (puzzle 6) computes both at
once, so the backward that travels back through the pipeline carries the weight gradients on its critical path,
and rank 0 waits (p-1)·BW for its first gradient. Split it:

    B   the input gradient:      dx = torch.autograd.grad(y, a, g, retain_graph=True)   (keeps the graph for W)
    W   the weight gradients:    y.backward(g, inputs=weights)   (adds into w.grad; frees the graph)

B goes on the critical path alone and the pipeline drains faster; each W waits until the rank would otherwise sit
idle. In ZB-H1 (Qi et al. 2024) rank r runs 1F1B's p-1-r warm-up forwards, then forward, B, and a W, but keeps r
W's waiting, which it runs in the cool-down where 1F1B idles. Every rank then holds p microbatches (a microbatch's
activations go with its W, not its B), as many as 1F1B's rank 0:

    time -->  (Fi: microbatch i's forward, F; Bi: its input gradient, B, about F; Wi===: its weight gradients, W,
               about 2.4F; .: idle)
    rank 0  F0F1F2F3......B0W0===F4B1W1===F5B2W2===F6B3W3===F7B4W4===B5W5===B6W6===B7W7===
    rank 1  ..F0F1F2....B0F3B1W0===F4B2W1===F5B3W2===F6B4W3===F7B5W4===B6W5===B7W6===W7===
    rank 2  ....F0F1..B0F2B1F3B2W0===F4B3W1===F5B4W2===F6B5W3===F7B6W4===B7W5===W6===W7===
    rank 3  ......F0B0F1B1F2B2F3B3W0===F4B4W1===F5B5W2===F6B6W3===F7B7W4===W5===W6===W7===

    1F1B, for comparison (Bi===: the whole backward, BW, about 2.7F):
    rank 0  F0F1F2F3...............B0===F4B1===F5B2===F6B3===F7B4===..B5===..B6===..B7===
    rank 3  ......F0B0===F1B1===F2B2===F3B3===F4B4===F5B5===F6B6===F7B7===...............

The bubble: rank 0 waits (p-1)·B for its first input gradient (1F1B: (p-1)·BW); the last rank waits (p-1)·F for
its first activation, as in 1F1B; and the cool-down's gaps, (p-1)·F in 1F1B, are filled by W's whenever W >= F,
as here. So each rank idles at most (p-1)·max(F, B, F + B - W) (the paper's (p-1)·(F + B - W) when F = B = W, a third of
1F1B's (p-1)·(F + B + W)): 3·1,116 = 3,348 ticks here against 1F1B's 12,120.

The split has a price here: W = y.backward(g, inputs=weights) walks the stage's graph again from y, so it
recomputes the input path's products inside the stage (B's 4 matmuls and W's 7 are 11, where the whole backward
has 8): B + W = 3,786 ticks against BW = 2,940. The step still ends sooner than 1F1B's (43,354 ticks against
45,089), but only because m is small: the second walk costs m·846 ticks, the bubble saved a fixed 8,772, and at
m = 16 1F1B would end first. Production implementations avoid the price altogether: they keep the gradients B
computed at each weight's input and output (Megatron-LM's WeightGradStore), so that W is the weight-gradient
products alone, and B + W is no more than BW. That is allowed here too, and faster (about 30,200 ticks).

Write `zero_bubble_step(dist, layers, x, target, n_micro, micro_shape)`, with puzzle 6's contract:
  - `layers`: this stage's 2 blocks, a list of (w1 [64, 256], w2 [256, 64]) pairs with requires_grad;
  - `x`: the batch, [64, 64], on rank 0 (None on the other ranks); `target`: [64, 64] on the last rank (else None);
  - `n_micro`: m = 8; microbatch i is rows 8i to 8i+7 (`x.chunk(n_micro)[i]`, `target.chunk(n_micro)[i]`);
  - `micro_shape`: (8, 64), the shape of one microbatch's activations between stages and of their gradients.
  Leave the gradient of the full-batch loss `loss_fn(forward(x, all layers), target)` in `w.grad` of this stage's
  weights (they start as zeros), each microbatch's loss being `loss_fn(y, target_i) / n_micro`, and return the
  gradient of the loss with respect to this stage's input for the whole batch ([64, 64], microbatch i in rows 8i to
  8i+7; on rank 0, dL/dx).

The clock (puzzle 5's: the puzzles' GPU, messages free of latency at 4,096 bytes a tick), one stage, one
microbatch: F = 1,100 ticks (4 matmuls, 2 gelus, 2 adds); B = 1,116 ticks (4 matmuls, 2 gelu backwards, 2 adds);
W = 2,670 ticks (7 matmuls, 2 gelu backwards, an add, and the 4 weight gradients added into w.grad, 196 ticks
each); the whole backward BW = 2,940. The last stage's loss adds LF = 35 ticks to F and LB = 40 to B, and to W
(autograd walks the loss again). A message: 1 tick.

Checks (sizes: p=4 ranks, m=8 microbatches, batch 64, d=64, h=256, L=8 blocks, 2 per stage):
  - stage gradients and input gradients: equal to the serial reference, as in puzzle 5.
  - stage compute, every op counted: at most m·(F + B + W) + m·(LF + 2·LB) + m·mb·d = 32,141,528 FLOPs on the
    last stage (F = 1,053,696, B = 1,053,696, W = 1,905,152 FLOPs), and at least 25,165,824 FLOPs of matmuls, the
    products of one forward and one whole backward per microbatch (so the WeightGradStore split passes too).
  - bubble: the last stage's idle time, the makespan less its compute (counted up to its work in the formula,
    m·(F + B + W) + m·(LF + 2·LB) = 40,008 ticks: extra work fills no bubble), at most (p-1)·max(F, B, F + B - W) +
    B/2 = 3,348 + 558 = 3,906 ticks (B/2 for the 1-tick messages and the returned gradients' cat). 1F1B idles
    (p-1)·(F + BW) = 12,120 ticks; with the backward split but each W run right after its B, (p-1)·(F + B) = 6,648.
    As in puzzle 5, the idle time is read off the clock only once the clock holds the stages' work where the
    messages say it ran: every activation a stage sends on, and every gradient it sends back, needs its stage's
    products (at least half of them) since its input arrived, and the step can be no shorter than the products of
    the critical path at the peak rate; a schedule the clock could not have run (work done in another thread, say)
    fails here.
  - activation memory: on every rank, the peak less its weights, their gradients, x or target and the returned
    dL/d(input) (2·2·d·h·8 + 2·2·d·h·8 + 2·B·d·8 = 1,114,112 bytes on ranks 0 and 3, 1,081,344 on ranks 1-2) is at
    most p·A + p·mb·d·8 + d·h·8 + A/2 = 479,232 bytes: puzzle 6's bound on rank 0 (A = 73,728 bytes, one
    microbatch's activations on one stage; d·h·8, a weight's fresh gradient; A/2 of slack), and the p stage inputs
    [8, 64] a later rank received. A W deferred keeps its microbatch's activations: defer more than r on rank r and
    a rank holds more than p. torch.autograd.grad for W would hold all four fresh weight gradients at once.
  - B before W: ranks 1 to 3 send each input gradient before computing its microbatch's weight gradients, read off
    the backward FLOPs done at each send (at the k-th, at most k B's and k - 1 W's, + B/2). A backward left whole
    fails it, and so does a W run before its B.
  - a deadlock is an error, reported with what each rank waits for.
  - keep everything as torch tensors.

Hints:
  - Keep each microbatch's (input, output) from its forward until its W, and its output gradient g from its B
    until its W (W backpropagates the same g).
  - Send with isend and keep the handle: an activation's handle can be waited for once its gradient has come back
    (the next rank has surely received it by then); a gradient's at the end of the step.
  - `torch.profiler.record_function(f"F{i}")`, `(f"B{i}")` and `(f"W{i}")` around a microbatch's work name it on
    the schedule: `python -m grader check puzzles -p p17 --schedule` draws a W labelled so as W, and shows the W's
    filling what was 1F1B's bubble.
"""

from collections import deque

import torch

from puzzles.model import forward, loss_fn


def zero_bubble_step(dist, layers, x, target, n_micro, micro_shape):
    raise NotImplementedError("p17: write zero_bubble_step")
