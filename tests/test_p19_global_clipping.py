"""p19: the figures against their formulas (the reference's bytes and optimizer state exactly; the budgets the text
states), the serial truth (the hand-written replay is clip_grad_norm_ and torch.optim.Adam; every replayed mistake
and every wrong norm is far from the truth), the inputs' promise (the norm above max_norm at step 2 and below it at
steps 1 and 4, at every seed tried), where each fault lands after the reduce-scatter, the three naive answers the
issue names failing with their cause named, and odd norms handed back crashing nothing."""

import copy
import math

import pytest
import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_file, observe
from grader.core.grading import one_thread
from grader.core.result import FAIL
from grader.core.rules import sent
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p19_global_clipping import layout as lay
from grader.specs.p19_global_clipping import spec as p19

SPEC = SPECS["p19"]
TOL = 1e-8


@pytest.fixture(scope="module")
def reference_run():
    inputs = SPEC.make_inputs(0)
    obs = observe(SPEC, load_module(REPO / "solutions" / SPEC.filename), inputs, 0)
    return obs, inputs, SPEC.reference(inputs)


def test_the_sizes_and_the_budgets_are_the_texts():
    assert (lay.PSI_RANK, lay.SHARD, lay.PSI) == (8_320, 4_160, 16_512)
    assert lay.PSI_RANK == sum(p.numel() for p in lay.rank_params(lay.init_params(0), 0))
    budgets = SPEC.budgets(SPEC.make_inputs(0))
    assert budgets["communication"].value == 7 * 2 * (2 - 1) * 8 * 8_320 // 2 + 1_024 == 466_944
    assert budgets["optimizer state"].value == (8 + 8 + 8 + 1) * 4_160 + 1_024 == 105_024


def test_the_reference_sends_the_formula_exactly(reference_run):
    """A reduce-scatter at every step (7), an all-gather at every step taken (4 of them: a skipped step gathers
    nothing), two scalar all-reduces per step over a pair (8 bytes each); the harness's own all-reduces are not
    the learner's."""
    obs, _, _ = reference_run
    learner = [e for e in obs.events if not e["site"].startswith("[harness]")]
    harness = [e for e in obs.events if e["site"].startswith("[harness]") and e["stream"] == "comm"
               and e["kind"] == "all_reduce"]
    assert harness  # the pair's forward and backward all-reduces happen, and are the harness's
    for r in range(lay.N):
        mine = sent(type(obs)(obs.results, obs.peak_bytes, obs.ledgers, learner, obs.makespan), r)
        rs, ag = (lay.D - 1) * 8 * lay.PSI_RANK // lay.D, (lay.D - 1) * 8 * lay.PSI_RANK // lay.D
        assert mine == {"reduce_scatter_tensor": (7, 7 * rs), "all_gather_into_tensor": (4, 4 * ag),
                        "all_reduce": (14, 14 * 8)}, mine
        assert sum(b for _, b in mine.values()) == 366_192


def test_the_reference_keeps_master_m_and_v_of_its_shard_exactly(reference_run):
    obs, _, _ = reference_run
    for res in obs.results:
        assert res["state_per_step"] == [3 * 8 * lay.SHARD] * lay.K_STEPS == [99_840] * 5
        assert sorted(numel for _, numel, _ in res["kept"]) == [lay.SHARD] * 3


def test_the_reference_reports_the_serial_norms_and_skips(reference_run):
    obs, _, ref = reference_run
    for res in obs.results:
        for got, want in zip(res["norms"], ref["main"]["norms"]):
            assert (math.isnan(got) and math.isnan(want)) or (math.isinf(got) and math.isnan(want)) or \
                abs(got - want) <= TOL * want
        assert math.isnan(res["norms"][2]) and math.isinf(res["norms"][4])  # the NaN, then the inf
        assert all(cs == [] for cs in res["skips"].values())


def test_the_replay_is_clip_grad_norm_and_torch_adam():
    inputs = SPEC.make_inputs(4)
    skipped = lay.skipped_steps(lay.FAULTS)
    ours = lay.replay(inputs["params"], inputs["batches"], skipped)
    theirs = lay.torch_reference(inputs["params"], inputs["batches"], skipped)["weights"]
    for a, b in zip(ours, theirs):
        for name in lay.PARAM_NAMES:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-13)


def test_every_replayed_mistake_is_far_from_the_reference():
    inputs = SPEC.make_inputs(4)
    skipped = lay.skipped_steps(lay.FAULTS)
    right = lay.replay(inputs["params"], inputs["batches"], skipped)[-1]
    for knobs, _ in p19.REPLAYED:
        wrong = lay.replay(inputs["params"], inputs["batches"], skipped, **knobs)[-1]
        assert max((wrong[n] - right[n]).abs().max().item() for n in lay.PARAM_NAMES) > 100 * TOL, knobs


@pytest.mark.parametrize("seed", range(0, 200, 7))
def test_the_clipped_steps_are_the_texts_at_every_seed(seed):
    """Step 2's norm above max_norm (clipped), steps 1 and 4 below it (left alone), with the margins the text
    states; steps 3 and 5 are skipped."""
    inputs = SPEC.make_inputs(seed)
    norms = lay.torch_reference(inputs["params"], inputs["batches"], lay.skipped_steps(lay.FAULTS))["norms"]
    assert norms[1] > 105 > lay.MAX_NORM > 75 > max(norms[0], norms[3]), norms
    assert math.isnan(norms[2]) and math.isnan(norms[4])


def test_each_fault_lands_where_the_text_says():
    """After the reduce-scatter over the data-parallel pair, a parameter of block b is in the shard of the rank
    with dp = b: step 3's NaN (rank 1, layers[1]) in rank 3's, step 5's inf (rank 3, layers[0]) in rank 1's, a
    replicated parameter's copy on tensor-parallel rank 1 (rank 2's copy finite); the second run's (rank 2,
    layers[1]) in rank 2's own."""
    def owner(fault):
        block = int(fault.param.split("[")[1][0])
        _, tp = lay.coords(fault.rank)
        return tp + lay.T * block

    nan, inf = lay.FAULTS
    assert (nan.step, owner(nan), math.isnan(nan.value)) == (3, 3, True)
    assert (inf.step, owner(inf), inf.value) == (5, 1, math.inf)
    assert lay.REPLICATED[inf.param.split(".")[-1]] and lay.coords(inf.rank)[1] == 1
    assert owner(lay.PROBE_FAULTS[0]) == lay.PROBE_FAULTS[0].rank == 2
    assert lay.SHARD == lay.PSI_RANK // lay.L  # each half of the flat vector is one block's parameters


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_wrong_norm_is_the_right_one(seed):
    """A diagnosis names a mistake by the norm it gives: every candidate must be far from the global norm and from
    every other candidate, at every rank, or a right answer could be named."""
    inputs = SPEC.make_inputs(seed)
    grads = lay.gradient(inputs["params"], inputs["batches"][0])
    true = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    for rank in range(lay.N):
        values = [v for v, _ in lay.norm_candidates(grads, rank)] + [true]
        for i, a in enumerate(values):
            for b in values[i + 1:]:
                assert abs(a - b) > 1e3 * TOL * max(a, b), (rank, values)


@pytest.mark.parametrize("answer, phrase", [
    ("naive/p19_global_clipping.py", "a local norm"),
    ("wrong/p19_replicated_counted_twice.py", "were counted 2 times, once per rank that holds them"),
    ("wrong/p19_rank_local_skip.py", "a rank-local skip"),
])
def test_the_naive_answers_the_issue_names_fail_with_their_cause(answer, phrase):
    result = grade_file(SPEC, REPO / "tests" / answer, seed=11)
    assert result.status == FAIL
    assert any(phrase in c.diagnosis for c in result.checks if not c.passed), [c.to_dict() for c in result.checks]


ODD_NORMS = {"None": None, "a string": "norm", "three numbers": "tensor([1., 2., 3.])", "NaN everywhere": math.nan,
             "zero": 0.0, "negative": -51.0}


@pytest.mark.parametrize("variant", list(ODD_NORMS))
def test_an_odd_norm_fails_the_norm_check_and_crashes_nothing(reference_run, variant):
    obs, inputs, ref = reference_run
    odd = copy.copy(obs)
    odd.results = list(obs.results)
    rank = lay.N - 1
    norms = list(obs.results[rank]["norms"])
    norms[0] = ODD_NORMS[variant]
    odd.results[rank] = {**obs.results[rank], "norms": norms}
    with one_thread():
        checks = {c.name: c for c in SPEC.check(odd, ref, inputs)}
    assert not checks["global norm"].passed and f"rank {rank}" in checks["global norm"].message
    assert all(c.passed for name, c in checks.items() if name != "global norm")


def test_a_step_that_returns_nothing_is_told_to_return_the_norm(tmp_path):
    source = (REPO / "solutions" / SPEC.filename).read_text().replace("        return norm\n        # END",
                                                                      "        return None\n        # END")
    (tmp_path / SPEC.filename).write_text(source)
    result = grade_file(SPEC, tmp_path / SPEC.filename, seed=2)
    [norm] = [c for c in result.checks if c.name == "global norm"]
    assert not norm.passed and "must return the global norm" in norm.diagnosis
    assert [c.name for c in result.checks if not c.passed] == ["global norm"]
