"""p23's sizes, its data, which rank is slow, the serial truth, and the terms of its budgets.

Step s trains on rows s·B..(s+1)·B of the data, the same global batch of B rows for every rank: each rank reads
the rows it takes. One rank's device is K = 3/2 times as slow as the others' (which one: the seed's). The balanced
split gives each rank rows in proportion to its speed: B = 88 = 24 + 24 + 24 + 16, three fast ranks and the slow
one, whose 16 rows take it as long as 24 take the others. The budgets' terms are measured on the clock
(tests/test_p23_straggler.py re-measures each): C the slow rank's step on its 16 rows, A the gradients'
all-reduce, P a probe of a forward and backward on 8 rows on the slow rank.
"""

from __future__ import annotations

from fractions import Fraction

import torch
import torch.utils.data as tud

from puzzles.model import forward, init_layers, loss_fn, make_batch

N, L, D, H = 4, 2, 64, 256
B, STEPS, LR = 88, 4, 0.01  # rows per step (the global batch), steps, SGD's rate
K = Fraction(3, 2)  # the slow rank's device takes K times as long for every op
BALANCED = (24, 16)  # rows of a fast rank, of the slow rank: B·1/(3 + 1/K) and B·(1/K)/(3 + 1/K)
EVEN = B // N  # 22: the split as handed out
F64 = 8
GRADIENT_BYTES = 2 * L * D * H * F64  # 524,288
ALL_REDUCE_BYTES = 2 * (N - 1) * GRADIENT_BYTES // N  # 786,432
C = 10_986  # the slow rank's step on its 16 rows (forward, backward, the loss weighed by 16/B, the update), each op
#             K times as long as on a fast rank, rounded up
C_FAST = 10_259  # a fast rank's step on its 24 rows (the balanced split leaves it waiting C - C_FAST a step)
A = 1_584  # the gradients' all-reduce: 2(N-1)·8 + 2(N-1)/N·G/512
P = 4_611  # a probe, allowed for: a forward and backward on 8 rows on the slow rank (K times, op by op)
TOLERANCE = STEPS * C // 20  # 5% of S·C: 2,197
MAKESPAN_BUDGET = P + STEPS * (C + A) + TOLERANCE  # 4,611 + 4 x 12,570 + 2,197 = 57,088
WAIT_BUDGET = STEPS * C // 5  # 20% of S·C: 8,788


def slow_rank_of(seed: int) -> int:
    return int(torch.randint(0, N, (1,), generator=torch.Generator().manual_seed(seed * 7_919 + 23)))


def make_inputs(seed: int) -> dict:
    x, target = make_batch(STEPS * B, D, seed * 1_009 + 23)
    return {"layers": init_layers(L, D, H, seed * 31 + 23, requires_grad=False), "x": x, "target": target,
            "lr": LR, "slow_rank": slow_rank_of(seed)}


def step_batch(inputs: dict, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    return inputs["x"][s * B:(s + 1) * B], inputs["target"][s * B:(s + 1) * B]


def sgd_step(layers, x, target, lr: float):
    """One SGD step of the serial model on (x, target): the weights after it."""
    layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
    weights = [w for pair in layers for w in pair]
    grads = torch.autograd.grad(loss_fn(forward(x, layers), target), weights)
    with torch.no_grad():
        return [(w1 - lr * g1, w2 - lr * g2) for (w1, w2), g1, g2 in zip(layers, grads[0::2], grads[1::2])]


def reference_run(inputs: dict) -> dict:
    """S serial SGD steps, each on the whole batch of its step (the loss averaged over its B rows)."""
    layers, after = inputs["layers"], []
    for s in range(STEPS):
        layers = sgd_step(layers, *step_batch(inputs, s), inputs["lr"])
        after.append(layers)
    return {"weights": layers, "after_each_step": after}


class StepBatch(tud.Dataset):
    """One step's global batch of B rows: `batch[i]`, `batch[lo:hi]`, `batch[[i, j]]` give (x rows, target rows).
    It notes which rows the rank read, for the check that every row is read by exactly one rank."""

    def __init__(self, x: torch.Tensor, target: torch.Tensor):
        self._x, self._target, self._read = x, target, set()

    def __len__(self) -> int:
        return self._x.shape[0]

    def __getitem__(self, index):
        n = len(self)
        if isinstance(index, slice):
            rows = range(n)[index]
        elif isinstance(index, int):
            rows = [index % n]
        elif isinstance(index, torch.Tensor) and index.dtype == torch.bool:
            rows = [i for i, keep in enumerate(index.tolist()) if keep]
        else:
            rows = [int(i) % n for i in (index.tolist() if isinstance(index, torch.Tensor) else index)]
        self._read.update(rows)
        return self._x[index], self._target[index]

    def rows_read(self) -> list[int]:
        return sorted(self._read)
