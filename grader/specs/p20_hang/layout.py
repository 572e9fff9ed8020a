"""p20's sizes, its data (where the fault sits, from the seed) and the serial truth, with the mistakes replayed.

Each step, every rank holds ROWS rows of the global batch, of which only some are real samples: `valid` marks them
(the others are padding). The loss is the squared error summed over features and averaged over the *real* rows of
the whole batch, every rank's:

    loss_s = Σ_{real rows i of every rank} ‖f(x_i) - t_i‖² / n_s        n_s = every rank's real rows, together

Two runs (A and B) of STEPS steps each, on fresh weights, so that a fix tied to one layout fails the other. In each
run, one rank has no real row at one step (its whole share is padding: the data-dependent skip's trigger), and the
ranks' counts of real rows differ, so that their numbers of microbatches (ceil(count / MICRO)) differ at some step
(the rank-dependent loop count). Which rank and which step, and the counts, come from the seed; the empty rank of
run B is never run A's.
"""

from __future__ import annotations

import math

import torch

from puzzles.model import forward, init_layers, make_batch

N, L, D, H = 4, 2, 32, 64  # ranks; blocks of width d, hidden h
ROWS, MICRO, STEPS, LR = 8, 4, 4, 0.05  # rows per rank and step, rows per microbatch, steps per run, SGD's rate
RUNS = ("A", "B")
F64 = 8
GRADIENT_BYTES = 2 * L * D * H * F64  # every weight's gradient, float64: 65,536 bytes
ALL_REDUCE_BYTES = 2 * (N - 1) * GRADIENT_BYTES // N  # what a rank sends in an all-reduce of them: 98,304
STEPS_IN_ALL = len(RUNS) * STEPS
SHARE_FLOPS = STEPS_IN_ALL * 12 * L * D * H * ROWS  # a forward and backward on the rank's ROWS rows at every step
COMPUTE_CEILING = 3 * SHARE_FLOPS // 2  # 4,718,592: half as much again (a second forward to log, elementwise ops)
TIMEOUT_TICKS = 1_000_000  # the job's collective timeout (init_process_group's timeout=): 1 ms at a tick a ns


def _layout(g: torch.Generator, avoid_rank: int | None) -> tuple[list[list[int]], tuple[int, int]]:
    """Each step's count of real rows per rank, and (step, rank) of the one empty share."""
    while True:
        counts = torch.randint(1, ROWS + 1, (STEPS, N), generator=g).tolist()
        step, rank = (int(v) for v in torch.randint(0, STEPS, (1,), generator=g).tolist() + torch.randint(
            0, N, (1,), generator=g).tolist())
        if rank == avoid_rank:
            continue
        counts[step][rank] = 0
        uneven = any(len({math.ceil(c / MICRO) for c in row if c}) > 1 for s, row in enumerate(counts) if s != step)
        if uneven:
            return counts, (step, rank)


def make_inputs(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed * 7_919 + 20)
    runs, avoid = {}, None
    for k, name in enumerate(RUNS):
        counts, empty = _layout(g, avoid)
        avoid = empty[1]
        steps = []
        for s in range(STEPS):
            x, target = make_batch(N * ROWS, D, seed * 100 + 10 * k + s)
            valid = torch.zeros(N * ROWS, dtype=torch.bool)
            for r in range(N):
                chosen = torch.randperm(ROWS, generator=g)[:counts[s][r]]
                valid[r * ROWS + chosen] = True
            steps.append((x, target, valid))
        runs[name] = {"layers": init_layers(L, D, H, seed + 1 + k), "steps": steps, "counts": counts, "empty": empty}
    return {"runs": runs, "lr": LR}


def shard(step, rank: int):
    """Rank `rank`'s rows of one step: (x, target, valid), each its ROWS rows."""
    x, target, valid = step
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    return x[rows], target[rows], valid[rows]


# ---- the serial truth, and the mistakes replayed (each a way of normalizing, each a way of choosing the data)

NORMALIZATIONS = {
    "global mean": "the mean over every rank's real rows",
    "mean of means": "each rank's mean over its own real rows, averaged over the ranks (÷ N)",
    "sum of means": "each rank's mean over its own real rows, summed over the ranks",
    "padding counted": "the sum over the real rows divided by every row, padding included (N·ROWS)",
}
SELECTIONS = {
    "every row": "every real row of every rank",
    "skipped step": "no update at all at a step where some rank has no real row (every rank skipped it)",
    "fewest microbatches": "each rank's first m·MICRO real rows only, m the fewest microbatches of any rank",
}


def _rank_rows(step, rank: int, selection: str, counts: list[int]):
    x, target, valid = shard(step, rank)
    rows, targets = x[valid], target[valid]
    if selection == "fewest microbatches":
        keep = min(math.ceil(c / MICRO) for c in counts) * MICRO
        rows, targets = rows[:keep], targets[:keep]
    return rows, targets


def step_loss(layers, step, normalization: str = "global mean", selection: str = "every row"):
    """The loss a program of this normalization and selection takes the gradient of (None: it skips the step)."""
    counts = [int(shard(step, r)[2].sum()) for r in range(N)]
    if selection == "skipped step" and 0 in counts:
        return None
    parts = [_rank_rows(step, r, selection, counts) for r in range(N)]
    errors = [((forward(rows, layers) - t) ** 2).sum() if len(rows) else torch.zeros((), dtype=torch.float64)
              for rows, t in parts]
    sizes = [len(rows) for rows, _ in parts]
    total = sum(sizes)
    if total == 0:  # every row dropped: nothing to learn from
        return torch.zeros((), dtype=torch.float64)
    if normalization == "global mean":
        return sum(errors) / total
    if normalization == "padding counted":
        return sum(errors) / (N * ROWS)
    means = [e / n for e, n in zip(errors, sizes) if n]
    if normalization == "mean of means":
        return sum(means) / N
    return sum(means)  # "sum of means"


def sgd_step(layers, step, lr: float, normalization: str = "global mean", selection: str = "every row"):
    """(the weights after one step from `layers`, its loss): SGD on the chosen loss; None when it skips."""
    layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
    loss = step_loss(layers, step, normalization, selection)
    if loss is None or not loss.requires_grad:  # skipped, or no row left at all: no update
        return [(w1.detach(), w2.detach()) for w1, w2 in layers], loss
    loss.backward()
    return [(w1.detach() - lr * w1.grad, w2.detach() - lr * w2.grad) for w1, w2 in layers], loss.detach()


def reference_run(run: dict, lr: float) -> dict:
    """The serial truth of one run: the weights after each step and each step's loss."""
    layers, weights, losses = run["layers"], [], []
    for step in run["steps"]:
        layers, loss = sgd_step(layers, step, lr)
        weights.append(layers)
        losses.append(loss)
    return {"weights": weights, "losses": losses}


def global_loss(layers, step) -> torch.Tensor:
    """The step's loss at `layers` (what a rank logs: the same number on every rank)."""
    with torch.no_grad():
        return step_loss([(w1.detach(), w2.detach()) for w1, w2 in layers], step)
