"""p21's sizes, its data and the serial truth, and the terms of its time budget.

Each rank holds S·b rows (its share of S global batches of N·b rows); step s trains on rows s·b..(s+1)·b of every
rank. The budget's terms are puzzle 7's model on the same clock: FB its forward and backward, U this puzzle's
update (as puzzle 7 counts it: averaged in place, scaled by lr, subtracted), A one block's all-reduce.
"""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch

N, L, D, H = 4, 4, 64, 256
B, STEPS, LR = 8, 6, 0.005  # rows per rank and step, steps, SGD's rate
TAU = 1_500  # ticks of a CPU core to load one sample
F64 = 8
GRADIENT_BYTES = 2 * L * D * H * F64  # 1,048,576
ALL_REDUCE_BYTES = 2 * (N - 1) * GRADIENT_BYTES // N  # 1,572,864
FIRST_LOAD = B * TAU  # 12,000
FB = 6_307  # puzzle 7's forward and backward of one rank's 8 rows
U = 2 * L * 460  # 3,680: puzzle 7's update: each gradient averaged in place (132), scaled by lr (132), subtracted (196)
C = FB + U  # 9,987
A = 816  # one block's all-reduce: 2(N-1)·8 + 2(N-1)/N·(2·d·h·8)/512
TOLERANCE = STEPS * C // 20  # 5% of S·C: 2,996
MAKESPAN_BUDGET = FIRST_LOAD + STEPS * (C + A) + TOLERANCE  # 79,814
OVERLAP_BUDGET = STEPS * 2 * A  # 9,792: the communication with no compute under it, at most two blocks' a step


def make_inputs(seed: int) -> dict:
    x, target = make_batch(N * STEPS * B, D, seed * 1_009 + 21)
    return {"layers": init_layers(L, D, H, seed * 31 + 21, requires_grad=False), "x": x, "target": target,
            "lr": LR}


def rows_of(inputs: dict, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's S·b rows: of each step's global batch of N·b rows, its b."""
    idx = torch.cat([torch.arange(s * N * B + rank * B, s * N * B + (rank + 1) * B) for s in range(STEPS)])
    return inputs["x"][idx].clone(), inputs["target"][idx].clone()


def step_batch(inputs: dict, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    return inputs["x"][s * N * B:(s + 1) * N * B], inputs["target"][s * N * B:(s + 1) * N * B]


def reference_run(inputs: dict) -> dict:
    """S serial SGD steps on the whole batch of each step: the weights after them, and each step's loss."""
    layers = [(w1.clone().requires_grad_(), w2.clone().requires_grad_()) for w1, w2 in inputs["layers"]]
    losses, own = [], []
    for s in range(STEPS):
        x, target = step_batch(inputs, s)
        with torch.no_grad():  # each rank's own loss (its b rows): what a log that is not all-reduced shows
            own.append(torch.stack([loss_fn(forward(x[r * B:(r + 1) * B], layers), target[r * B:(r + 1) * B])
                                    for r in range(N)]))
        loss = loss_fn(forward(x, layers), target)
        grads = torch.autograd.grad(loss, [w for pair in layers for w in pair])
        losses.append(loss.detach())
        with torch.no_grad():
            for w, g in zip((w for pair in layers for w in pair), grads):
                w -= inputs["lr"] * g
    return {"weights": [(w1.detach(), w2.detach()) for w1, w2 in layers], "losses": torch.stack(losses),
            "own_losses": torch.stack(own).T}  # [N, S]
