"""p17's costs: puzzle 6's stage (2 blocks, one microbatch) with its backward split as a learner splits it, and the
zero-bubble schedule's bubble as a formula in them.

    F   the stage's forward                                     (the last stage: and the microbatch's loss)
    B   torch.autograd.grad(y, a, g, retain_graph=True)         the input gradient alone: 4 matmuls
    W   y.backward(g, inputs=weights)                           the weight gradients, added into w.grad: 7 matmuls,
                                                                for autograd walks the graph from y again (the
                                                                input path's products inside the stage included)

Measured with sim.tally on the serial model (costs.measure), as puzzle 5's F and BW are. In the ZB-H1 order each
rank idles (p-1)·max(F, B, F + B - W): rank 0 waits (p-1)·B for its first input gradient, the last rank (p-1)·F
for its first activation, and the deferred W's fill the cool-down's gaps, all of them when W >= F (else (p-1)·(F -
W) stays: the paper's (p-1)·(F + B - W) for F = B = W). 1F1B idles (p-1)·(F + BW).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from puzzles.model import DTYPE, forward, init_layers, loss_fn

from ..common.costs import Cost, measure
from ..common.pipeline_values import BACKWARD, COST, D, FORWARD, H, LOSS_BACKWARD, LOSS_FORWARD, M, MB, P, PER


@lru_cache(maxsize=None)
def split_costs(last: bool) -> tuple[Cost, Cost, Cost]:
    """(F, B, W) of one stage on one microbatch; `last`: the stage that computes the loss too."""
    layers = init_layers(PER, D, H, seed=0)
    weights = [w for block in layers for w in block]  # w1, w2 of each block
    for w in weights:
        w.grad = torch.zeros_like(w)  # the grader hands every weight a zeroed .grad: W adds into it
    a = torch.ones(MB, D, dtype=DTYPE).requires_grad_()
    target = torch.zeros(MB, D, dtype=DTYPE)
    seed = None if last else torch.ones(MB, D, dtype=DTYPE)  # the gradient that arrives: not the stage's work
    out = {}

    def run_forward():
        y = forward(a, layers)
        out["y"] = loss_fn(y, target) / M if last else y

    f = measure(COST, run_forward)
    b = measure(COST, lambda: torch.autograd.grad(out["y"], a, seed, retain_graph=True))
    w = measure(COST, lambda: out["y"].backward(seed, inputs=weights))
    return f, b, w


F_COST, B_COST, W_COST = split_costs(last=False)
LAST_F, LAST_B, LAST_W = split_costs(last=True)
STAGE_WORK = [M * (F_COST + B_COST + W_COST)] * (P - 1) + [M * (LAST_F + LAST_B + LAST_W)]
F, B, W = F_COST.ticks, B_COST.ticks, W_COST.ticks
BW = BACKWARD.ticks
ZB_IDLE = (P - 1) * max(F, B, F + B - W)  # ZB-H1's idle ticks per rank
ONE_F_ONE_B_IDLE = (P - 1) * (FORWARD.ticks + BW)  # puzzle 6's, with the backward whole
SLACK = B // 2  # the 1-tick messages, the returned gradients' cat, a receive posted a little late
LOSS_TICKS = (LOSS_FORWARD + LOSS_BACKWARD).ticks
