"""p5/p6: the simulated figures equal the textbook formulas where the cost model makes them exact.

- GPipe's and 1F1B's makespan is (m+p-1)·3F plus a few 1-tick messages, the same number whatever F is: with free
  messages the bubble would be exactly (p-1)/(m+p-1).
- Before its first backward, rank 0 holds exactly m microbatches' activations under GPipe and p under 1F1B
  (plus the one receive buffer for the gradient that starts the backward), measured on the ledger.
"""

from fractions import Fraction
from pathlib import Path

import pytest

from grader.backends.learner_code import load_module
from grader.core.spec import Observation
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.pipeline_values import D, F_TICKS, MB, M, P
from grader.specs.p6_one_f_one_b import ACT, WEIGHTS, B
from puzzles import model, sim
from puzzles.sim import CostModel

ROOT = REPO
GPIPE = ROOT / "solutions" / "p5_gpipe.py"
ONE_F_ONE_B = ROOT / "solutions" / "p6_one_f_one_b.py"
GPIPE_AS_P6 = ROOT / "tests" / "naive" / "p6_one_f_one_b.py"  # p5's solution, under p6's name


def observe(puzzle: str, path: Path, cost: CostModel | None = None) -> Observation:
    spec = SPECS[puzzle]
    inputs = spec.make_inputs(0)
    args, rank_args = spec.launch(inputs)
    result = sim.run(spec.program(load_module(path)), spec.world_size, args=args, rank_args=rank_args,
                     cost=cost or spec.cost, library_files=[model.__file__])
    return Observation.from_sim(result)


@pytest.mark.parametrize("puzzle, path", [("p5", GPIPE), ("p6", ONE_F_ONE_B)])
def test_makespan_is_the_formula_plus_a_constant_number_of_message_ticks(puzzle, path):
    overheads = []
    for scale in (1, 4):  # F = 1,024 ticks, then 4,096 ticks; messages still cost 1 tick
        cost = CostModel(flops_per_tick=SPECS[puzzle].cost.flops_per_tick // scale, latency_ticks=0,
                         bytes_per_tick=4096)
        obs = observe(puzzle, path, cost)
        f = F_TICKS * scale
        assert all(obs.busy_ticks(r) == M * 3 * f for r in range(P))  # every stage: m forwards F, m backwards 2F
        overheads.append(obs.makespan - (M + P - 1) * 3 * f)
    assert overheads[0] == overheads[1]  # the messages' ticks, independent of F
    assert 0 <= overheads[0] <= 4 * (M + P)  # a few 1-tick messages per microbatch on the critical path
    # so with free messages the bubble is 1 - m·3F / ((m+p-1)·3F) = (p-1)/(m+p-1) exactly
    assert 1 - Fraction(M * 3, (M + P - 1) * 3) == Fraction(P - 1, M + P - 1)


@pytest.mark.parametrize("puzzle, path, held", [("p6", ONE_F_ONE_B, P), ("p6", GPIPE_AS_P6, M), ("p5", GPIPE, M)])
def test_rank_0_holds_p_microbatches_under_1f1b_and_m_under_gpipe(puzzle, path, held):
    obs = observe(puzzle, path)
    first_backward = min(e["start"] for e in obs.events_of(0, "compute", "backward"))
    before = max(b for t, b in obs.ledgers[0]["timeline"] if t < first_backward)
    static = 2 * WEIGHTS + B * D * 8  # weights, their (zeroed) gradients, x
    assert before - static == held * ACT + MB * D * 8  # + the receive buffer of the first gradient
    assert SPECS[puzzle].forwards_before_first_backward(obs, 0) == held
