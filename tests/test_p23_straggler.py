"""p23, the straggler: the budgets' terms are what the clock charges (each re-measured here), the slow rank moves
with the seed (so a program that names one fails at another seed), and the story's figures are the run's.
tests/test_sim_timing.py holds the timing events themselves."""

from __future__ import annotations

import math

import torch

from grader.backends.simulator import grade_file
from grader.core.result import FAIL, PASS
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p23_straggler import layout as lay
from puzzles import sim
from puzzles.model import forward, init_layers, loss_fn, make_batch

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


def test_the_slow_rank_moves_with_the_seed_and_the_run_uses_it():
    assert {lay.slow_rank_of(seed) for seed in range(8)} == set(range(lay.N))
    inputs = SPEC.make_inputs(7)
    assert SPEC.cost_for(inputs).slow_ranks == ((lay.slow_rank_of(7), lay.K),)


def test_a_fix_that_remembers_the_slow_rank_of_one_seed_fails_at_another():
    """tests/wrong/p23_hard_coded_slow_rank.py names rank 3, the slow one at seed 0: it passes there, and fails at
    each seed where another rank is slow."""
    path = REPO / "tests" / "wrong" / "p23_hard_coded_slow_rank.py"
    assert lay.slow_rank_of(0) == 3 and lay.slow_rank_of(1) != 3
    assert grade_file(SPEC, path, seed=0).status == PASS
    assert grade_file(SPEC, path, seed=1).status == FAIL


def test_the_handed_out_program_is_over_the_budget_and_the_reference_within():
    handed_out = grade_file(SPEC, REPO / "tests" / "naive" / "p23_straggler.py", seed=2)
    reference = grade_file(SPEC, REPO / "solutions" / "p23_straggler.py", seed=2)
    makespan = {r: next(c for c in g.checks if c.name == "makespan") for r, g in (("naive", handed_out),
                                                                                  ("reference", reference))}
    assert makespan["reference"].measured <= lay.MAKESPAN_BUDGET < makespan["naive"].measured
    assert f"{makespan['reference'].measured:,}" in (REPO / "solutions" / "p23_straggler.py").read_text()
    assert f"{makespan['naive'].measured:,}" in (REPO / "solutions" / "p23_straggler.py").read_text()
