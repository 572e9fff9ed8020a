"""p12: the inputs route as the puzzle text says at every seed, the reference's figures are the formulas exactly
(the all-to-all's wire bytes are the tokens that leave each rank; each rank computes its kept tokens' expert FLOPs;
rank 0, the busiest, sets the step's length), and answers whose returned values are odd crash nothing.

- Every seed: the same margins (kept per rank, sent away, received, computed), 3 tokens over capacity per rank,
  each token's largest logit its designed expert; but the counts one rank sends another change with the seed, so
  an answer cannot know its receive sizes without exchanging the counts.
"""

import copy

import pytest
import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_file, observe
from grader.core import report
from grader.core.grading import one_thread
from grader.core.rules import sent
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p12_expert_parallel import routing
from grader.specs.p12_expert_parallel.spec import bytes_of, compute_of, least_of

SPEC = SPECS["p12"]


@pytest.mark.parametrize("seed", [0, 1, 2, 17, 123456])
def test_every_seed_routes_with_the_margins_the_text_states(seed):
    inputs = SPEC.make_inputs(seed)
    kept = routing.kept_totals(inputs["counts"])
    n = routing.N
    assert [sum(row) for row in kept] == [13] * n
    assert [sum(kept[s][d] for s in range(n)) for d in range(n)] == routing.KEPT_ON == [22, 14, 10, 6]
    assert [kept[r][r] for r in range(n)] == [6, 4, 2, 1]
    assert [sum(row) for row in inputs["counts"]] == [routing.N_TOKENS] * n
    for s in range(n):
        choice = (inputs["x"][s] @ inputs["router"]).argmax(dim=1)
        assert torch.bincount(choice, minlength=routing.E).tolist() == inputs["counts"][s]


def test_the_counts_between_two_ranks_change_with_the_seed():
    seen = {tuple(map(tuple, routing.kept_totals(SPEC.make_inputs(seed)["counts"]))) for seed in range(8)}
    assert len(seen) >= 4


def test_an_expert_no_token_reaches_has_a_zero_gradient_whether_or_not_the_answer_skips_it():
    """At seed 25 no token goes to expert 6: the serial gradient is zero, the reference's is zeros (a matmul of no
    rows) and an answer that skips the expert leaves .grad None. Both pass."""
    counts = SPEC.make_inputs(25)["counts"]
    assert all(counts[s][6] == 0 for s in range(routing.N))
    for path in (REPO / "solutions" / SPEC.filename, REPO / "tests" / "alternatives" / "p12_labels_sent_along.py"):
        result = grade_file(SPEC, path, seed=25)
        assert result.status == "pass", report.pytest_message(result, 25)


def reference():
    return observe(SPEC, load_module(REPO / "solutions" / SPEC.filename), SPEC.make_inputs(3), 3)


def test_the_reference_meets_the_formulas_exactly_and_rank_0_sets_the_pace():
    obs = reference()
    counts_bytes = (routing.E - routing.LOCAL) * 8  # the counts' all-to-all: 6 int64 leave each rank
    for r in range(routing.N):
        assert sum(e["product_flops"] for e in obs.events_of(r, "compute")) == least_of(r)  # the products, exactly
        assert least_of(r) < sum(e["flops"] for e in obs.events_of(r, "compute")) <= compute_of(r)
        wire = sum(b for _, b in sent(obs, r).values())
        assert wire == 2 * (routing.SENT_AWAY[r] + routing.RECEIVED[r]) * routing.ROW + counts_bytes
        assert wire <= bytes_of(r)
    busy = [obs.busy_ticks(r) for r in range(routing.N)]
    assert busy == [2_780, 1_960, 1_550, 1_152]  # 22, 14, 10, 6 tokens; the router and the routing on every rank
    assert max(busy) == busy[0] < obs.makespan < busy[0] + 100  # everyone waits for rank 0's experts


ODD = [None, "y", [1], 3.0]


@pytest.mark.parametrize("field, value", [(f, v) for f in ("y", "x_grad", "router_grad") for v in ODD]
                         + [("grads", v) for v in ODD + [[(None, None)] * 2]])
def test_an_odd_answer_fails_its_check_and_crashes_nothing(field, value):
    obs = reference()
    inputs = SPEC.make_inputs(3)
    odd = copy.copy(obs)
    odd.results = list(obs.results)
    odd.results[2] = {**obs.results[2], field: value}
    with one_thread():
        checks = {c.name: c for c in SPEC.check(odd, SPEC.reference(inputs), inputs)}
    assert all(isinstance(c.message, str) and isinstance(c.diagnosis, str) for c in checks.values())
    assert not any("could not work out" in c.diagnosis for c in checks.values())  # no diagnosis crashed either
    name = {"y": "output", "x_grad": "input gradient", "router_grad": "router gradient",
            "grads": "expert gradients"}[field]
    assert not checks[name].passed and "rank 2" in checks[name].message, checks[name].message
