"""p16: the interleaved pipeline's figures against the formulas the puzzle states.

- A chunk's costs are puzzle 5's F and BW cut in two, every op counted (the closed forms below).
- With free messages the reference's makespan is exactly (v·m + p - 1)·(F + BW)/v + m·(LF + LB) (and the two
  returned gradients' copies): the last rank idles (p-1)·(F + BW)/v, a bubble of (p-1)/(v·m) over the chunks' work;
  1F1B (puzzle 6's reference) idles (p-1)·(F + BW), (p-1)/m, and so does a flush per group: both fail.
- Before its first backward, rank 0 holds exactly v·p + p - 1 chunk activations under the interleaved order (and
  the inputs of those in chunk 1, received, and one gradient's buffer), all m·v under GPipe over the chunks.
- Every rank sends exactly one message per chunk boundary, each way: v times 1F1B's on the middle ranks, and
  (v·p - 1)/(p - 1) times its total.
"""

import copy
from fractions import Fraction

import pytest

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe_module
from grader.core.rules import sent
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.common.costs import copy as copy_cost
from grader.specs.p16_interleaved.layout import (CHUNK_ACT, CHUNK_BACKWARD, CHUNK_FORWARD, COST, LOSS_BACKWARD,
                                                 LOSS_FORWARD, MESSAGE, WORK, B, D, H, M, MB, P, V, forward_unit,
                                                 messages_sent, most_in_flight)
from grader.specs.p16_interleaved.spec import BOUND, WEIGHTS
from grader.specs.common.pipeline_values import BACKWARD, FORWARD
from puzzles.sim import CostModel

REFERENCE = REPO / "solutions" / "p16_interleaved.py"
GPIPE_OVER_CHUNKS = REPO / "tests" / "naive" / "p16_interleaved.py"
FLUSH_PER_GROUP = REPO / "tests" / "wrong" / "p16_group_by_group.py"
ONE_F_ONE_B = REPO / "solutions" / "p6_one_f_one_b.py"
FREE = CostModel(latency_ticks=0, bytes_per_tick=None)


def observe(puzzle, path, cost=None):
    spec = copy.copy(SPECS[puzzle])
    spec.cost = cost or spec.cost
    return observe_module(spec, load_module(path), spec.make_inputs(0), 0)


def test_a_chunk_costs_half_a_stage_every_op_counted():
    product = 2 * MB * D * H
    assert CHUNK_FORWARD.flops == 2 * product + MB * H + MB * D  # 2 matmuls, gelu, the residual add
    assert CHUNK_BACKWARD.flops == 4 * product + MB * H + MB * D + 2 * D * H  # + gelu', add, w.grad += twice
    assert (V * CHUNK_FORWARD, V * CHUNK_BACKWARD) == (FORWARD, BACKWARD)  # puzzle 5's F and BW, cut in two
    assert (CHUNK_FORWARD.ticks, CHUNK_BACKWARD.ticks) == (550, 1470)


def test_with_free_messages_the_makespan_is_the_interleaved_formula_exactly():
    returned = V * copy_cost(COST, B * D).ticks  # the two input gradients concatenated at the end
    obs = observe("p16", REFERENCE, FREE)
    assert [obs.busy_ticks(r) for r in range(P)] == [WORK[r].ticks + returned for r in range(P)]
    chunk = (CHUNK_FORWARD + CHUNK_BACKWARD).ticks
    assert obs.makespan == (V * M + P - 1) * chunk + M * (LOSS_FORWARD + LOSS_BACKWARD).ticks + returned
    idle = obs.makespan - obs.busy_ticks(P - 1)
    assert idle == (P - 1) * chunk == (P - 1) * (FORWARD + BACKWARD).ticks // V
    assert Fraction(idle, M * V * chunk) == Fraction(P - 1, V * M)
    graded = observe("p16", REFERENCE)  # 1-tick messages add a few ticks on the critical path, no more
    assert 0 <= graded.makespan - obs.makespan <= 2 * (V * M + P)


def test_the_bubble_budget_passes_the_interleaved_order_and_fails_1f1b_and_a_flush_per_group():
    budget = SPECS["p16"].budgets(None)["bubble"].value
    work = WORK[P - 1].ticks
    bubble = {name: (observe(puzzle, path).makespan - work) / work
              for name, puzzle, path in [("interleaved", "p16", REFERENCE), ("1F1B", "p6", ONE_F_ONE_B),
                                         ("flush per group", "p16", FLUSH_PER_GROUP)]}
    assert bubble["interleaved"] <= budget < float(Fraction(P - 1, M)) / 1.8  # about half of 1F1B's
    assert bubble["1F1B"] == pytest.approx(float(Fraction(P - 1, M)), abs=0.01)  # puzzle 6's W is the same work
    assert bubble["flush per group"] == pytest.approx(float(Fraction(P - 1, M)), abs=0.01)
    assert min(bubble["1F1B"], bubble["flush per group"]) > budget


@pytest.mark.parametrize("path, held", [(REFERENCE, most_in_flight(0)), (GPIPE_OVER_CHUNKS, M * V)])
def test_rank_0_holds_v_p_plus_p_minus_1_chunk_activations_and_gpipe_all(path, held):
    obs = observe("p16", path)
    first_backward = min(e["start"] for e in obs.events_of(0, "compute", "backward"))
    before = max(b for t, b in obs.ledgers[0]["timeline"] if t < first_backward)
    static = 2 * WEIGHTS + B * D * 8  # weights, their zeroed gradients, x
    received = sum(forward_unit(j)[0] == 1 for j in range(held))  # chunk 1's inputs come from rank 3
    assert before - static == held * CHUNK_ACT + received * MB * D * 8 + MB * D * 8  # + the first gradient's buffer
    assert most_in_flight(0) == V * P + P - 1 == 11
    assert held * CHUNK_ACT + D * H * 8 <= BOUND if held == most_in_flight(0) else held * CHUNK_ACT > BOUND


def test_every_rank_sends_one_message_per_chunk_boundary_v_times_1f1b():
    ours = observe("p16", REFERENCE)
    theirs = observe("p6", ONE_F_ONE_B)
    ours_bytes = [sum(b for _, b in sent(ours, r).values()) for r in range(P)]
    theirs_bytes = [sum(b for _, b in sent(theirs, r).values()) for r in range(P)]
    assert ours_bytes == [messages_sent(r) * MESSAGE for r in range(P)] == [98_304, 131_072, 131_072, 98_304]
    assert theirs_bytes == [32_768, 65_536, 65_536, 32_768]
    assert ours_bytes[1] == V * theirs_bytes[1] and ours_bytes[2] == V * theirs_bytes[2]
    assert Fraction(sum(ours_bytes), sum(theirs_bytes)) == Fraction(V * P - 1, P - 1)  # boundaries crossed
