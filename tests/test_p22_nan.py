"""p22, the NaN: where the faults sit moves with the seed (so a fix that remembers a row fails at another seed),
each fault shows the symptom the story says (inf at the spike step, nan at the poisoned one, the steps skipped),
and the story's log and figures are the run's."""

from __future__ import annotations

import math

import torch

from grader.backends.simulator import grade_file
from grader.backends.learner_code import load_module
from grader.core.result import FAIL, PASS
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p22_nan import layout as lay
from puzzles import sim

SPEC = SPECS["p22"]
STORY = (REPO / "solutions" / "p22_nan.py").read_text()


def _run(path, seed):
    inputs = SPEC.make_inputs(seed)
    shared, per_rank = SPEC.launch(inputs)
    return inputs, sim.run(SPEC.program(load_module(path)), lay.N, args=shared, rank_args=per_rank).results


def test_the_faults_move_with_the_seed_and_sit_where_the_inputs_say():
    faults = [lay.fault_of(seed) for seed in range(8)]
    assert len({(f["poison_step"], f["poison_rank"], f["poison_row"]) for f in faults}) == 8
    assert len({f["spike_step"] for f in faults}) > 2
    assert all(f["poison_step"] != f["spike_step"] for f in faults)
    inputs = SPEC.make_inputs(5)
    bad = (~torch.isfinite(inputs["x"])).nonzero().tolist()
    f = lay.fault_of(5)
    assert bad == [[f["poison_step"] * lay.B + f["poison_rank"] * lay.R + f["poison_row"], f["poison_col"]]]
    big = [s for s in range(lay.STEPS) if lay.step_batch(inputs, s)[1].abs().max() > 60]
    assert big == [f["spike_step"]]


def test_a_fix_that_remembers_the_poisoned_row_of_one_seed_fails_at_another():
    path = REPO / "tests" / "wrong" / "p22_remembered_row.py"
    answer = load_module(path)
    f = lay.fault_of(0)
    assert (answer.STEP, answer.RANK, answer.ROW) == (f["poison_step"], f["poison_rank"], f["poison_row"])
    assert grade_file(SPEC, path, seed=0).status == PASS
    assert grade_file(SPEC, path, seed=1).status == FAIL


def test_the_handed_out_program_logs_the_storys_symptoms_and_the_reference_the_float32_curve():
    """The story's log is seed 3's: the handed-out program's losses (inf at the spike, whose gradient is finite, so
    the step is taken; nan at the poisoned step, skipped: the masters unchanged) beside the float32 run's, which the
    reference matches."""
    inputs, handed_out = _run(REPO / "tests" / "wrong" / "p22_as_handed_out.py", 3)
    f = lay.fault_of(3)
    losses = [float(x) for x in handed_out[0]["losses"]]
    assert math.isinf(losses[f["spike_step"]]) and math.isnan(losses[f["poison_step"]])
    assert sum(math.isfinite(x) for x in losses) == lay.STEPS - 2
    after = [inputs["layers"]] + handed_out[0]["after_each_step"]
    skipped = [s for s in range(lay.STEPS) if all(torch.equal(a, b) for pa, pb in zip(after[s + 1], after[s])
                                                  for a, b in zip(pa, pb))]
    assert skipped == [f["poison_step"]]
    for s, x in enumerate(losses):
        shown = "inf" if math.isinf(x) else "nan" if math.isnan(x) else f"{x:,.2f}"
        assert f"step {s}  loss {shown} " in STORY, (s, shown)
    reference = lay.reference_run(inputs)["losses"]
    for s, x in enumerate(reference):
        assert f"step {s}  loss {x:,.2f}" in STORY, (s, x)
    assert f"rank {f['poison_rank']}'s row {f['poison_row']} holds a NaN" in STORY
    _, solution = _run(REPO / "solutions" / "p22_nan.py", 3)
    assert all(abs(float(g) - e) <= lay.LOSS_TOLERANCE * abs(e) for g, e in zip(solution[0]["losses"], reference))


def test_the_storys_figures_are_the_layouts():
    budget = SPEC.budgets(SPEC.make_inputs(0))["communication"].value
    assert budget == lay.STEPS * 2 * (lay.N - 1) * 4 * lay.PSI // lay.N + 1024
    for figure in (f"{budget:,}", f"{lay.ALL_REDUCE_BYTES:,}", f"{lay.GRADIENT_BYTES:,}", f"lr = {lay.LR}",
                   f"global norm of {lay.MAX_NORM:.0f}", f"loss scale {lay.INIT_SCALE:.0f}",
                   f"within {lay.LOSS_TOLERANCE:.1%}", "within 2e-3 x max(1",
                   f"{lay.D} x {lay.SPIKE:.0f}² =\n    {lay.D * lay.SPIKE ** 2:,.0f}"):
        assert figure in STORY, figure
