"""p13: the reference's figures are the formulas the text states (bytes exactly 2(N-1)/N·S and log2(N)·S, makespan
exactly the α-β formula plus the adds, one chunk or one tensor held), the crossover is where the text says on both
the α-β formulas and the clock, the budgets order the two algorithms on either side of it, and the world each
function is handed (sub_world.py) behaves as a world of its own on the simulator.
"""

import pytest
import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_file, observe
from grader.core import report
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p13_collectives.mistakes import sent_in
from grader.specs.p13_collectives.runs import (COST, RUNS, SHAPES, Run, comm_by_run, crossover_bytes, held_beyond,
                                               run_makespan, runs_of)
from grader.specs.p13_collectives.sub_world import sub_world
from puzzles import sim

SPEC = SPECS["p13"]
REFERENCE = load_module(REPO / "solutions" / SPEC.filename)


@pytest.fixture(scope="module")
def reference():
    return observe(SPEC, REFERENCE, SPEC.make_inputs(3), 3)


def test_the_runs_are_each_function_at_both_world_sizes_and_both_sizes():
    assert [(r.algorithm, r.n, r.nbytes) for r in RUNS] == [
        (a, n, s) for a in ("ring", "doubling") for n in (4, 8) for s in (4096, 524288)]
    assert SHAPES == {"small": (512,), "large": (512, 128)}


def test_the_reference_sends_exactly_the_formulas_bytes_in_every_run(reference):
    for i, run in enumerate(RUNS):
        for r in range(8):
            events = comm_by_run(reference, r)[i]
            sends = [e for e in events if e["kind"] == "send"]
            assert sent_in(events) == run.sent_bytes
            assert len(sends) == run.steps and {e["nbytes"] for e in sends} == {run.message_bytes}
    ring, doubling = Run("ring", 8, (512, 128)), Run("doubling", 8, (512, 128))
    assert ring.sent_bytes == 2 * 7 * 524288 // 8 and doubling.sent_bytes == 3 * 524288


def test_the_reference_takes_exactly_the_alpha_beta_formula_plus_the_adds(reference):
    """The text: a ring step is α + S/(Nβ) and its reduce-scatter steps add a chunk; a doubling round is α + S/β
    and adds the tensor; nothing else is on the critical path."""
    for i, run in enumerate(RUNS):
        for first in range(0, 8, run.n):
            span = run_makespan(reference, i, tuple(range(first, first + run.n)))
            assert span == run.alpha_beta_ticks + run.reduction_ticks, run.key
    assert Run("ring", 4, (512,)).alpha_beta_ticks == 6 * (128 + 1024 // 64)
    assert Run("doubling", 8, (512, 128)).alpha_beta_ticks == 3 * (128 + 524288 // 64)
    assert Run("ring", 4, (512, 128)).reduction_ticks == 3 * (-(-3 * 131072 // 2048) + 4)


def test_the_reference_holds_one_chunk_on_the_ring_and_one_tensor_in_doubling(reference):
    for i, run in enumerate(RUNS):
        held = {held_beyond(reference, r, reference.results[r]["marks"][i]) for r in range(8)}
        assert held == {run.message_bytes}, run.key


def test_the_alpha_beta_crossover_is_where_the_text_says():
    assert crossover_bytes(4) == 65536 == 8 * 128 * 64
    assert crossover_bytes(8) == pytest.approx(72089.6) == 8.8 * 128 * 64
    for run in RUNS:
        other = Run("doubling" if run.algorithm == "ring" else "ring", run.n, run.shape)
        small = run.nbytes < crossover_bytes(run.n)
        assert (run.alpha_beta_ticks < other.alpha_beta_ticks) == (small == (run.algorithm == "doubling"))


def alone(function, n: int, nbytes: int) -> int:
    tensors = [torch.randn(nbytes // 8, dtype=torch.float64) for _ in range(n)]
    return sim.run(lambda dist, t: function(dist, t), n, rank_args=[(t,) for t in tensors], cost=COST).makespan


@pytest.mark.parametrize("n, doubling_faster, ring_faster", [(4, 53248, 54272), (8, 62464, 62976)])
def test_on_the_clock_the_adds_move_the_crossover_to_the_sizes_the_text_gives(n, doubling_faster, ring_faster):
    """The text: 'doubling is the faster up to 52 KiB at N = 4 and 61 KiB at N = 8' (bench/COLLECTIVES.md)."""
    ring, doubling = REFERENCE.ring_all_reduce, REFERENCE.recursive_doubling_all_reduce
    assert alone(doubling, n, doubling_faster) < alone(ring, n, doubling_faster)
    assert alone(ring, n, ring_faster) < alone(doubling, n, ring_faster)


def test_meeting_both_budgets_makes_doubling_faster_when_small_and_the_ring_when_large():
    for n in (4, 8):
        for size, faster, slower in (("small", "doubling", "ring"), ("large", "ring", "doubling")):
            fast, slow = Run(faster, n, SHAPES[size]), Run(slower, n, SHAPES[size])
            assert fast.makespan_budget < slow.alpha_beta_ticks, (n, size)


def test_every_budget_is_the_table_of_the_text():
    text = (REPO / "solutions" / SPEC.filename).read_text()
    for run in RUNS:
        row = next(line for line in text.splitlines() if line.strip().startswith(run.key + " "))
        for figure in (run.sent_bytes, run.alpha_beta_ticks, run.reduction_ticks, run.tolerance_ticks,
                       run.makespan_budget, run.held_budget):
            assert f"{figure:,}" in row, (run.key, figure, row)


def test_runs_of_keeps_the_graded_order():
    assert [r.key for r in runs_of("ring")] == [r.key for r in RUNS[:4]]


# ---- the world each function is handed


def run_in_halves(fn):
    """fn(world) on 8 simulated ranks, as two worlds of 4 (ranks 0-3 and 4-7); each rank's return value."""
    def program(dist):
        groups = {ranks: dist.new_group(list(ranks)) for ranks in ((0, 1, 2, 3), (4, 5, 6, 7))}
        ranks = (0, 1, 2, 3) if dist.get_rank() < 4 else (4, 5, 6, 7)
        return fn(sub_world(dist, ranks, groups[ranks]))

    return sim.run(program, 8, cost=COST)


def test_a_world_of_four_numbers_its_ranks_and_maps_its_peers():
    def fn(world):
        me = world.get_rank()
        t = torch.full((2,), float(me), dtype=torch.float64)
        got = torch.empty(2, dtype=torch.float64)
        works = [world.isend(t, (me + 1) % 4), world.irecv(got, (me - 1) % 4)]
        for w in works:
            w.wait()
        source = world.recv(got) if me == 0 else world.send(t, 0) if me == 3 else None
        return me, world.get_world_size(), got[0].item(), source

    result = run_in_halves(fn)
    assert [r[:3] for r in result.results] == [(r % 4, 4, float((r - 1) % 4)) for r in range(8)]
    assert [result.results[r][3] for r in (0, 4)] == [3, 3]  # recv from any rank says the world's rank


def test_a_collective_in_a_world_of_four_runs_on_that_world():
    def fn(world):
        t = torch.full((1,), 1.0 + world.get_rank(), dtype=torch.float64)
        world.all_reduce(t)
        return t.item()

    result = run_in_halves(fn)
    assert result.results == [10.0] * 8
    assert {tuple(e.peers) for e in result.events if e.kind == "all_reduce"} == {(0, 1, 2, 3), (4, 5, 6, 7)}


def test_batch_isend_irecv_takes_the_worlds_ranks():
    def fn(world):
        me, t = world.get_rank(), torch.zeros(1, dtype=torch.float64)
        ops = [world.P2POp(world.isend, torch.ones(1, dtype=torch.float64) * me, me ^ 1),
               world.P2POp(world.irecv, t, me ^ 1)]
        for w in world.batch_isend_irecv(ops):
            w.wait()
        return t.item()

    assert run_in_halves(fn).results == [float(r % 4 ^ 1) for r in range(8)]


@pytest.mark.parametrize("call, error", [
    (lambda w: w.new_group([0, 1]), AttributeError),
    (lambda w: w.send(torch.zeros(1), 4), ValueError),
    (lambda w: w.get_rank(group=object()), ValueError),
    (lambda w: w.P2POp(print, torch.zeros(1), 1), ValueError),
])
def test_what_a_world_of_its_own_refuses_says_why(call, error):
    def fn(world):
        with pytest.raises(error) as caught:
            call(world)
        return str(caught.value)

    messages = run_in_halves(fn).results
    assert all("world of 4 ranks" in m or "isend or dist.irecv" in m for m in messages), messages


def test_an_answer_that_keeps_the_worlds_collectives_is_graded_not_refused():
    result = grade_file(SPEC, REPO / "tests" / "wrong" / "p13_ring_by_collectives.py", seed=0)
    assert [c.name for c in result.failed_checks()] == ["no collective"], report.pytest_message(result, 0)


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="torch.distributed with gloo is not available")
def test_on_gloo_the_worlds_of_four_carry_collectives_on_their_own_group_and_the_verdicts_agree():
    """sub_world on torch.distributed: a collective in a world of 4 runs on that world's process group (values
    right, 'no collective' failed, as on the simulator); the references and naive answers are compared with the
    simulator in test_real_backend.py."""
    from grader.backends import real
    from grader.core.grading import grade_observation

    path = REPO / "tests" / "wrong" / "p13_ring_by_collectives.py"
    outcomes = []
    [on_gloo] = real.grade_files([(SPEC, path)], 0, outcomes_out=outcomes)
    inputs = SPEC.make_inputs(0)
    simulated = observe(SPEC, load_module(path), inputs, 0)
    assert real.compare(simulated, real.observation(outcomes[0].payloads)).agree
    expected = {c.name: (c.passed, c.measured) for c in grade_observation(SPEC, simulated, inputs).checks}
    assert {c.name: (c.passed, c.measured) for c in on_gloo.checks if not c.simulator_only} == \
        {name: v for name, v in expected.items() if name not in SPEC.simulator_only}
    assert [c.name for c in on_gloo.failed_checks()] == ["no collective"]
