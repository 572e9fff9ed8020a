"""p23, the straggler: the budgets' terms are what the clock charges (each re-measured here), the slow rank moves
with the seed (so a program that names one fails at another seed), and the timing events (sim.cuda.Event) measure
a slow rank's device K times as long, on the simulator and, with the same program, on gloo."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist_module

from grader.backends.simulator import grade_file
from grader.core.result import FAIL, PASS
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p23_straggler import layout as lay
from puzzles import sim
from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import cuda

SPEC = SPECS["p23"]


def _step(dist, rows: int, measure_probe: bool = False):
    """One rank's balanced step on `rows` rows (forward, backward, the update), or the probe allowance's forward
    and backward on 8 rows: the budget's terms, on the rank's compute stream."""
    layers = init_layers(lay.L, lay.D, lay.H, 0)
    x, target = make_batch(rows, lay.D, 0)
    start = sim.cuda.Event(enable_timing=True)
    end = sim.cuda.Event(enable_timing=True)
    start.record()
    loss = loss_fn(forward(x, layers), target) * rows / lay.B
    loss.backward()
    if not measure_probe:
        with torch.no_grad():
            for w in (w for pair in layers for w in pair):
                w -= lay.LR * w.grad
    end.record()
    return start.elapsed_time(end)


def _ticks(rows: int, slow: bool, probe: bool = False) -> int:
    cost = sim.CostModel(slow_ranks=((0, lay.K),) if slow else ())
    ms = sim.run(lambda dist: _step(dist, rows, probe), 1, cost=cost).results[0]
    return round(ms * 1_000_000)


def test_the_budgets_terms_are_what_the_clock_charges():
    fast, slow = lay.BALANCED
    assert 3 * fast + slow == lay.B and fast * 1 == slow * lay.K  # rows in proportion to the speeds
    assert _ticks(slow, slow=True) == lay.C
    assert _ticks(fast, slow=False) == lay.C_FAST <= lay.C
    assert _ticks(8, slow=True, probe=True) == lay.P
    assert lay.A == 2 * (lay.N - 1) * 8 + math.ceil(lay.ALL_REDUCE_BYTES / 512)
    assert lay.MAKESPAN_BUDGET == lay.P + lay.STEPS * (lay.C + lay.A) + lay.STEPS * lay.C // 20
