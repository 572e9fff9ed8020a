"""p7's cost model does what its text says: C is exactly the compute the reference does (forward, backward and the
update, every op on the roofline), the stated all-reduce costs are the simulator's, and what the makespan check
measures is the communication left exposed. (Overlaps with other bucket sizes are in tests/alternatives/.)"""

import ast

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe
from grader.core.result import PASS
from grader.frontends.targets import REPO, grade_target
from grader.specs import SPECS
from grader.specs.p7_overlap import spec as p7
from grader.specs.common.costs import elementwise

SPEC = SPECS["p7"]


def text():
    return ast.get_docstring(ast.parse((REPO / "solutions" / SPEC.filename).read_text()))


def test_stated_costs_are_the_simulators():
    assert (p7.compute_ticks(), p7.block_all_reduce_ticks(), p7.weight_all_reduce_ticks()) == (9987, 816, 432)
    assert (p7.FORWARD_BACKWARD.ticks, p7.UPDATE.ticks) == (6307, 3680)
    for figure in ("9,987", "6,307", "3,680", "816", "432", "1,315", "3,456", "499", "alpha = 8"):
        assert figure in text(), figure


def test_reference_computes_exactly_c_and_hides_all_but_the_tail():
    [result] = grade_target("solutions", ["p7"], seed=0)
    assert result.status == PASS
    inputs = SPEC.make_inputs(0)
    module = load_module(REPO / "solutions" / SPEC.filename)
    obs = observe(SPEC, module, inputs, 0)
    # the reference folds the average into the learning rate (lr / world): its update is C's without that pass
    average = 2 * p7.L * elementwise(p7.COST, p7.D * p7.H, 2).ticks
    assert [obs.busy_ticks(r) for r in range(p7.N)] == [p7.compute_ticks() - average] * p7.N
    assert obs.makespan - obs.busy_ticks(0) < p7.block_all_reduce_ticks()


def test_naive_leaves_all_communication_exposed():
    module = load_module(REPO / "tests" / "naive" / SPEC.filename)
    obs = observe(SPEC, module, SPEC.make_inputs(0), 0)
    compute = max(obs.busy_ticks(r) for r in range(p7.N))
    assert obs.makespan - compute == 2 * p7.L * p7.weight_all_reduce_ticks() == 3456
