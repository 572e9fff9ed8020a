"""p7's cost model does what its text says: the compute budget is exactly the compute the step does, and the stated
all-reduce costs are the simulator's. (Overlaps with other bucket sizes are in tests/alternatives/.)"""

import ast

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe
from grader.core.result import PASS
from grader.frontends.targets import REPO, grade_target
from grader.specs import SPECS
from grader.specs import p7_overlap as p7

SPEC = SPECS["p7"]


def text():
    return ast.get_docstring(ast.parse((REPO / "solutions" / SPEC.filename).read_text()))


def test_stated_costs_are_the_simulators():
    assert (p7.compute_ticks(), p7.block_all_reduce_ticks(), p7.weight_all_reduce_ticks()) == (5888, 816, 432)
    for figure in ("5,888", "816", "432", "6,998", "9,344", "1,024", "512", "alpha = 8"):
        assert figure in text(), figure
    # every matmul's FLOPs is a whole number of ticks, so the compute budget is exact
    assert (2 * p7.ROWS * p7.D * p7.H) % p7.COST.flops_per_tick == 0


def test_reference_computes_exactly_the_compute_budget_and_hides_all_but_the_tail():
    [result] = grade_target("solutions", ["p7"], seed=0)
    assert result.status == PASS
    inputs = SPEC.make_inputs(0)
    module = load_module(REPO / "solutions" / SPEC.filename)
    obs = observe(SPEC, module, inputs, 0)
    assert [obs.busy_ticks(r) for r in range(p7.N)] == [p7.compute_ticks()] * p7.N
    assert obs.makespan - p7.compute_ticks() < p7.block_all_reduce_ticks()


def test_naive_takes_compute_plus_all_communication():
    module = load_module(REPO / "tests" / "naive" / SPEC.filename)
    obs = observe(SPEC, module, SPEC.make_inputs(0), 0)
    assert obs.makespan == p7.compute_ticks() + 2 * p7.L * p7.weight_all_reduce_ticks() == 9344
