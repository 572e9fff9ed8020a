"""What the model's pieces cost on the clock: the building blocks of every compute and time budget.

Each budget is a formula over the serial model's own ops, every op counted (matmuls, elementwise ops,
reductions), as the clock charges them (puzzles/simulator/op_costs.py, cost.py). The numbers are measured with
`sim.tally` on the serial model itself, so that they are exactly what the same ops cost inside a rank; the puzzle
texts give each as its formula (tests/test_costs.py holds the formulas to the measurements):

    a block's forward on r rows    2 matmuls (2·r·d·h FLOPs each), gelu (r·h), the residual add (r·d)
    its backward                   4 matmuls (input and weight gradient of each), gelu's backward (r·h), the two
                                   gradients of its input added (r·d); without the input gradient (the batch's
                                   own), 3 matmuls and no add; each weight gradient added into an existing .grad
                                   (an accumulation, 1 FLOP per weight element) where the puzzle keeps one
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from puzzles.model import DTYPE, block, loss_fn
from puzzles.sim import CostModel, OpCost, tally


@dataclass(frozen=True)
class Cost:
    """The cost of a piece of work: FLOPs (what the compute checks count) and ticks (what the clock charges)."""

    flops: int
    ticks: int
    ops: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.ticks + other.ticks, self.ops + other.ops)

    def __mul__(self, n: int) -> Cost:
        return Cost(self.flops * n, self.ticks * n, self.ops * n)

    __rmul__ = __mul__


ZERO = Cost(0, 0)


def measure(cost: CostModel, fn) -> Cost:
    """What `fn()` costs on the clock of `cost`."""
    with tally(cost) as t:
        fn()
    return Cost(t.flops, t.ticks, t.ops)


def _leaf(shape, grad: bool) -> torch.Tensor:
    return torch.ones(shape, dtype=DTYPE).requires_grad_(grad)


@lru_cache(maxsize=None)
def block_costs(rows: int, d: int, h: int, cost: CostModel, input_grad: bool = True,
                accumulate: bool = False) -> tuple[Cost, Cost]:
    """(forward, backward) of one residual MLP block on `rows` rows. `input_grad`: the block's input needs its
    gradient; `accumulate`: its weights already hold a .grad, which backward adds into."""
    x, w1, w2 = _leaf((rows, d), input_grad), _leaf((d, h), True), _leaf((h, d), True)
    if accumulate:
        w1.grad, w2.grad = torch.zeros_like(w1), torch.zeros_like(w2)
    out = {}
    forward = measure(cost, lambda: out.setdefault("y", block(x, w1, w2)))
    seed = torch.ones(rows, d, dtype=DTYPE)  # the gradient that arrives from the block after: not the block's work
    backward = measure(cost, lambda: out["y"].backward(seed))
    return forward, backward


@lru_cache(maxsize=None)
def loss_costs(rows: int, d: int, cost: CostModel, divide_by: int = 1) -> tuple[Cost, Cost]:
    """(forward, backward) of `loss_fn` on [rows, d] (divided by `divide_by` if it is more than 1: a microbatch's
    share of the mean), up to the gradient of its input."""
    y, target = _leaf((rows, d), True), torch.zeros(rows, d, dtype=DTYPE)
    out = {}

    def forward():
        loss = loss_fn(y, target)
        out["loss"] = loss / divide_by if divide_by > 1 else loss

    f = measure(cost, forward)
    b = measure(cost, lambda: out["loss"].backward())
    return f, b


def elementwise(cost: CostModel, n: int, tensors: int = 2, flops: int = 1, itemsize: int = 8) -> Cost:
    """One elementwise op over n elements that reads and writes `tensors` tensors of n elements in all (2: an
    in-place scale, or a copy; 3: a sum of two into a third): n·flops FLOPs, on the roofline."""
    return Cost(n * flops, cost.compute_ticks(OpCost(n * flops, n * tensors * itemsize)), 1)


def copy(cost: CostModel, n: int, itemsize: int = 8) -> Cost:
    """Moving n elements (torch.cat, clone): no FLOPs, a read and a write of each."""
    return Cost(0, cost.compute_ticks(OpCost(0, 2 * n * itemsize)), 1)
