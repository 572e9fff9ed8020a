"""p5/p6: the simulated figures equal the formulas where the cost model makes them exact.

- Every stage computes exactly m·(F + BW) on the clock (the last stage m·(LF + LB) more, its loss), and the
  concatenated dL/d(input) it returns; with free messages, GPipe's and 1F1B's makespan is exactly
  (m+p-1)·(F + BW) + m·(LF + LB) plus that last copy. The stage costs are the serial model's, every op counted.
- Before its first backward, rank 0 holds exactly m microbatches' activations under GPipe and p under 1F1B
  (plus the one receive buffer for the gradient that starts the backward), measured on the ledger.
"""

import copy
from pathlib import Path

import pytest

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe_module
from grader.core.spec import Observation
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.common.costs import copy as copy_cost
from grader.specs.common.pipeline_values import (BACKWARD, COST, FORWARD, LOSS_BACKWARD, LOSS_FORWARD, STAGE_WORK, D,
                                                 MB, M, P)
from grader.specs.p6_one_f_one_b.spec import ACT, WEIGHTS, B
from puzzles.sim import CostModel

ROOT = REPO
GPIPE = ROOT / "solutions" / "p5_gpipe.py"
ONE_F_ONE_B = ROOT / "solutions" / "p6_one_f_one_b.py"
GPIPE_AS_P6 = ROOT / "tests" / "naive" / "p6_one_f_one_b.py"  # p5's solution, under p6's name


def observe(puzzle: str, path: Path, cost: CostModel | None = None) -> Observation:
    """The run as the grader observes it (the harness's own ops off the clock), on `cost`'s machine."""
    spec = copy.copy(SPECS[puzzle])
    spec.cost = cost or spec.cost
    return observe_module(spec, load_module(path), spec.make_inputs(0), 0)


@pytest.mark.parametrize("puzzle, path", [("p5", GPIPE), ("p6", ONE_F_ONE_B), ("p6", GPIPE_AS_P6)])
def test_with_free_messages_the_makespan_is_the_formula_exactly(puzzle, path):
    returned = copy_cost(COST, B * D).ticks  # the microbatches' input gradients concatenated, at the end
    obs = observe(puzzle, path)
    assert [obs.busy_ticks(r) for r in range(P)] == [STAGE_WORK[r].ticks + returned for r in range(P)]
    free = observe(puzzle, path, CostModel(latency_ticks=0, bytes_per_tick=None))
    pipeline = (M + P - 1) * (FORWARD + BACKWARD).ticks + M * (LOSS_FORWARD + LOSS_BACKWARD).ticks
    assert free.makespan == pipeline + returned
    # the messages of the graded cost model (1 tick each) add a few ticks on the critical path, no more
    assert 0 <= obs.makespan - free.makespan <= 2 * (M + P)


@pytest.mark.parametrize("puzzle, path, held", [("p6", ONE_F_ONE_B, P), ("p6", GPIPE_AS_P6, M), ("p5", GPIPE, M)])
def test_rank_0_holds_p_microbatches_under_1f1b_and_m_under_gpipe(puzzle, path, held):
    obs = observe(puzzle, path)
    first_backward = min(e["start"] for e in obs.events_of(0, "compute", "backward"))
    before = max(b for t, b in obs.ledgers[0]["timeline"] if t < first_backward)
    static = 2 * WEIGHTS + B * D * 8  # weights, their (zeroed) gradients, x
    assert before - static == held * ACT + MB * D * 8  # + the receive buffer of the first gradient
    assert SPECS[puzzle].forwards_before_first_backward(obs, 0) == held
