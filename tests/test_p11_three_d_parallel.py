"""p11: the layout, the group rules on hand-made observations, the figures the formulas give, and answers whose
returned groups or values are odd.

- The layout is Megatron's (tp fastest, then dp, then pp), and the other orders are named when a learner's groups
  follow one of them.
- The group rules read the events' peers: a collective on the default group or the pipeline group is off, a send
  to a rank of another replica or other columns is off, a barrier is free; the bytes on each group are counted
  on that group only.
- With free messages the reference's pipeline takes (m+p-1)·3F exactly, so the bubble is (p-1)/(m+p-1) = 1/5;
  every rank computes m·3F and sends exactly the formulas' bytes on its two groups.
- Whatever build_3d_groups or three_d_step returns, no check or diagnosis crashes.
"""

import copy

import pytest

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe
from grader.core.grading import one_thread
from grader.core.result import Budget
from grader.core.rules import group_communication_check, off_group, sent_on_group
from grader.core.spec import Observation
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p11_three_d_parallel import layout
from grader.specs.common.costs import copy as copy_cost
from grader.specs.p11_three_d_parallel.groups import allowed_groups, groups_check, neighbours
from puzzles.sim import CostModel

SPEC = SPECS["p11"]


def event(rank, kind, peers, wire_bytes=0, stream="comm", flops=0, start=0, end=0):
    return {"rank": rank, "stream": stream, "kind": kind, "start": start, "end": end, "flops": flops,
            "nbytes": wire_bytes, "wire_bytes": wire_bytes, "label": "", "phase": "forward", "peers": tuple(peers),
            "site": "answer.py:1", "ops": 1}


def right_groups():
    return [{"groups": {"tp": layout.tp_ranks(r), "dp": layout.dp_ranks(r), "pp": layout.pp_ranks(r)}}
            for r in range(layout.WORLD)]


def observation(events, results=None):
    n = layout.WORLD
    return Observation(results or right_groups(), [0] * n, [{}] * n, events, max([e["end"] for e in events] + [0]))


def test_the_layout_is_tensor_parallel_fastest_then_data_then_pipeline():
    assert [layout.coords(r) for r in (0, 1, 2, 5, 7)] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    assert layout.partition("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.partition("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.partition("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert all(layout.rank_of(*layout.coords(r)) == r for r in range(layout.WORLD))
    others = layout.other_layouts()
    assert len(others) == 5 and "dp fastest, then tp, then pp" in others
    assert others["dp fastest, then tp, then pp"]["tp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_collectives_belong_on_the_tensor_or_data_parallel_group_and_sends_on_the_pipeline():
    events = [event(0, "all_reduce", [0, 1]), event(0, "all_reduce", [0, 2]), event(0, "send", [0, 4]),
              event(4, "recv", [0, 4]), event(5, "barrier", range(8)),  # a barrier moves no data
              event(1, "all_reduce", [1, 5]), event(2, "all_reduce", range(8)), event(0, "send", [0, 5])]
    off = off_group(observation(events), allowed_groups, neighbours)
    assert [(e["rank"], e["kind"], e["peers"]) for e in off] == [
        (1, "all_reduce", (1, 5)), (2, "all_reduce", tuple(range(8))), (0, "send", (0, 5))]
    check = groups_check(observation(events))
    assert not check.passed and "rank 1 ran all_reduce on its pipeline group [1, 5]" in check.message
    assert "rank 0 (pp 0, dp 0, tp 0) sent" in check.message and "rank 4" in check.message
    assert groups_check(observation(events[:5])).passed


def test_groups_that_follow_another_layout_are_named():
    order = layout.other_layouts()["dp fastest, then tp, then pp"]
    results = [{"groups": {kind: next(g for g in order[kind] if r in g) for kind in ("tp", "dp", "pp")}}
               for r in range(layout.WORLD)]
    check = groups_check(observation([], results))
    assert not check.passed and "another layout, dp fastest, then tp, then pp" in check.diagnosis
    odd = groups_check(observation([], [{"groups": {"problem": "build_3d_groups returned a list of 2"}}] * 8))
    assert not odd.passed and "a list of 2" in odd.message and odd.diagnosis == ""


def test_the_bytes_on_a_group_are_counted_on_that_group_only():
    events = [event(0, "all_reduce", [0, 1], 100), event(0, "all_reduce", [0, 2], 7), event(0, "send", [0, 4], 50)]
    obs = observation(events)
    assert sent_on_group(obs, 0, [0, 1]) == {"all_reduce": (1, 100)}
    check = group_communication_check(obs, Budget("tp", "x", 99, "bytes"), "tp", layout.tp_ranks, "tensor-parallel")
    assert not check.passed and check.measured == 100 and "[0, 1]" in check.message


def reference(cost=None):
    spec = copy.copy(SPEC)
    if cost is not None:
        spec.cost = cost
    return observe(spec, load_module(REPO / "solutions" / SPEC.filename), SPEC.make_inputs(0), 0)


def test_with_free_messages_the_pipeline_takes_the_formula_exactly():
    obs = reference(CostModel(latency_ticks=0, bytes_per_tick=None))
    span = max(e["end"] for e in obs.events_of(stream="compute", kind="backward"))
    # the reference's g copies its [mb, d] input before all-reducing it in place, and f its gradient: 2 copies per
    # block per microbatch, one each way, beside F and BW
    copies = 2 * layout.PER * copy_cost(layout.COST, layout.MB * layout.DIM).ticks
    pipeline = (layout.M + layout.P - 1) * ((layout.FORWARD + layout.BACKWARD).ticks + copies)
    loss = layout.M * (layout.LOSS_FORWARD + layout.LOSS_BACKWARD).ticks
    assert span == pipeline + loss == 12_632


def test_every_rank_computes_and_sends_exactly_the_formulas():
    obs = reference()
    for r in range(layout.WORLD):
        stage = layout.STAGE_WORK[layout.coords(r)[0]]
        averaged = layout.W_RANK // layout.F64  # the gradients divided by D after their all-reduce
        assert sum(e["flops"] for e in obs.events_of(r, "compute")) == stage.flops + averaged
        assert sum(e["product_flops"] for e in obs.events_of(r, "compute")) == layout.PRODUCTS == 6_291_456
        assert sum(b for _, b in sent_on_group(obs, r, layout.tp_ranks(r)).values()) == layout.TP_BYTES == 32_768
        assert sum(b for _, b in sent_on_group(obs, r, layout.dp_ranks(r)).values()) == layout.DP_BYTES == 524_288
    assert not off_group(obs, allowed_groups, neighbours)


ODD_GROUPS = [None, "groups", {"problem": "build_3d_groups returned a list of 2"}, {"tp": "not a process group "
              "(_NonGroupMember)", "dp": [0, 2], "pp": [0, 4]}, {"tp": [0, 1]}]
ODD_VALUES = [None, "x", [1], 3.0]


@pytest.mark.parametrize("field, value", [("groups", v) for v in ODD_GROUPS] + [("input_grad", v) for v in ODD_VALUES]
                         + [("grads", v) for v in ODD_VALUES + [[(None, None)] * 2]])
def test_an_odd_answer_fails_its_check_and_crashes_nothing(field, value):
    obs = reference()
    inputs = SPEC.make_inputs(0)
    odd = copy.copy(obs)
    odd.results = list(obs.results)
    odd.results[5] = {**obs.results[5], field: value}
    with one_thread():
        checks = {c.name: c for c in SPEC.check(odd, SPEC.reference(inputs), inputs)}
    assert all(isinstance(c.message, str) and isinstance(c.diagnosis, str) for c in checks.values())
    assert not any("could not work out" in c.diagnosis for c in checks.values())  # no diagnosis crashed either
    name = {"groups": "process groups", "input_grad": "input gradients", "grads": "stage gradients"}[field]
    assert not checks[name].passed and "rank 5" in checks[name].message, checks[name].message
