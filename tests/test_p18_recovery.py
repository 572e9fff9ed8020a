"""p18 (recovery): the job's figures against the formulas its text states, the job's design (every piece of the
state a checkpoint holds differs, at both checkpoints, from what a fresh process has, whatever the seed, so that
each piece left out is caught), the reference's crash points and bytes, and odd loads that crash no check."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from grader.backends.simulator import SimLauncher
from grader.backends.learner_code import load_module
from grader.core.grading import one_thread
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p18_recovery import spec as p18
from grader.specs.p18_recovery import job as jobs
from grader.specs.p18_recovery import training
from puzzles.simulator.filesystem import DISK

pytestmark = pytest.mark.xdist_group("p18_recovery")  # one xdist worker: its module-scoped reference job

SPEC = SPECS["p18"]
SEED = 0


@pytest.fixture(scope="module")
def reference_job():
    """The reference's whole job on the simulator: its record and observation, with the inputs and the control."""
    inputs = SPEC.make_inputs(SEED)
    launcher = SimLauncher(SPEC, load_module(REPO / "solutions" / SPEC.filename), inputs, SEED)
    control = SPEC.reference(inputs)
    record = jobs.job(launcher, control)
    return record, launcher, inputs, control


def test_the_bytes_budget_is_a_shard_the_replicated_state_and_framing():
    budget = SPEC.budgets(SPEC.make_inputs(SEED))["bytes written"]
    generator = torch.Generator().get_state()
    assert p18.SHARD_BYTES == 3 * 4 * training.PSI // training.N == 24_576  # master, m, v: float32
    assert p18.REPLICATED_BYTES == generator.numel() * generator.element_size() + 8 * training.SAMPLES == 5_824
    assert budget.value == 24_576 + 5_824 + 8_192 == 38_592


def test_every_seed_overflows_at_steps_1_and_5_and_no_piece_of_a_checkpoint_is_a_fresh_process_s():
    """The text's promise: each epoch's overflow falls at steps 1 and 5 whatever the seed, so Adam's count, the
    scale and its count of good steps at steps 2 and 4 all differ from what a fresh process starts with (a piece
    left out of the checkpoint is seen at both). Measured on the control for several seeds."""
    for seed in range(6):
        control = p18.control(seed)
        adam = [0] + [control["at"][s][0]["adam_steps"] for s in range(1, training.STEPS + 1)]
        skipped = tuple(s for s in range(1, training.STEPS + 1) if adam[s] == adam[s - 1])
        assert skipped == training.OVERFLOWS == (1, 5), (seed, adam)
        fresh = training.pieces(training.fresh_state(0, training.N, training.make_data(seed)[2], seed))
        for step in training.SAVES:
            at = control["at"][step][0]
            same = [name for name in training.PIECES if name not in ("master", "weights", "next")
                    and not training.piece_mismatch(fresh[name], at[name])]
            assert same == [], (seed, step, same)
        assert [(control["at"][s][0]["scale"], control["at"][s][0]["good_steps"]) for s in training.SAVES] == \
            [(512.0, 1), (512.0, 3)]


def test_the_reference_passes_with_the_figures_its_text_gives(reference_job):
    record, launcher, inputs, control = reference_job
    obs = launcher.observation([dict(r, job=record.to_dict()) if i == 0 else r for i, r in enumerate(record.train)])
    with one_thread():
        checks = {c.name: c for c in SPEC.check(obs, control, inputs)}
    assert all(c.passed for c in checks.values()), {n: c.message for n, c in checks.items() if not c.passed}
    # Bytes: each rank's shard is 24,576 bytes of tensors in torch.save's framing; rank 0 adds the manifest.
    written = {(e["rank"], e["phase"]): 0 for r in record.train for e in r["disk"]}
    for r in record.train:
        for e in r["disk"]:
            if e["op"] == "write":
                written[e["rank"], e["phase"]] += e["nbytes"]
    for step in training.SAVES:
        shard = written[1, f"save {step}"]
        assert p18.SHARD_BYTES < shard < p18.SHARD_BYTES + 2_048  # framing: about 2 KB
        assert all(written[r, f"save {step}"] == shard for r in (2, 3))
        manifest = written[0, f"save {step}"] - shard
        assert p18.REPLICATED_BYTES < manifest < p18.REPLICATED_BYTES + 2_560
    assert checks["bytes written"].measured == written[0, "save 4"] <= p18.SHARD_BYTES + p18.REPLICATED_BYTES + 8192
    if torch.__version__.startswith("2.13"):  # the numbers the text gives, measured on the pinned torch
        assert (written[1, "save 4"], written[0, "save 4"]) == (26_529, 34_374)


def test_the_references_crash_points_are_5_on_rank_0_and_2_on_each_other_rank_all_before_the_commit(
        reference_job):
    record, *_ = reference_job
    ops = [(p["event"]["rank"], p["event"]["op"]) for p in record.points]
    assert len(ops) == 11 and sorted(ops).count((0, "write")) == 2 and sorted(ops).count((0, "rename")) == 2
    assert ops.count((0, "makedirs")) == 1 and all(ops.count((r, "write")) == ops.count((r, "rename")) == 1
                                                   for r in (1, 2, 3))
    for point in record.points:
        assert point["died"] and not point["resume"].error
        assert {r["loaded"]["step"] for r in point["resume"].results} == {2}  # the commit is the last change


def test_the_disk_time_of_a_save_is_its_calls_and_bytes(reference_job):
    """The text's figures: rank 1's save is 2 calls (open, rename) and its shard's bytes; rank 0's 5 calls (the
    folder, the shard's open and rename, the manifest's) and both files' bytes."""
    record, launcher, *_ = reference_job
    # The train launch: one call of load_checkpoint on the empty disk (fs.exists), then two saves alike.
    io = {r: (sum(e.ticks for e in launcher.first.events if e.rank == r and e.kind == "io") - DISK.latency_ticks) // 2
          for r in (0, 1)}
    sizes = {r: [e["nbytes"] for e in record.train[r]["disk"] if e["op"] == "write" and e["phase"] == "save 4"]
             for r in (0, 1)}
    assert io[1] == 2 * DISK.latency_ticks + sum(math.ceil(n / DISK.bytes_per_tick) for n in sizes[1])
    assert io[0] == 5 * DISK.latency_ticks + sum(math.ceil(n / DISK.bytes_per_tick) for n in sizes[0])
    if torch.__version__.startswith("2.13"):
        assert (io[1], io[0]) == (5_317, 9_298)


def test_a_damaged_shard_is_the_one_of_rank_2_of_the_newest_checkpoint(reference_job):
    record, *_ = reference_job
    assert record.damaged_file == "checkpoints/step_000004/shard_2.pt"
    assert {r["loaded"]["step"] for r in record.damaged.results} == {2}


ODD = {
    "None": lambda v: None,
    "a string": lambda v: "4",
    "another dtype": lambda v: v.double() if isinstance(v, torch.Tensor) else float(v) + 0.5,
    "NaN": lambda v: torch.full_like(v, float("nan")) if isinstance(v, torch.Tensor) and v.is_floating_point()
    else float("nan"),
    "shorter": lambda v: v[:3] if isinstance(v, torch.Tensor) else -1,
}


@pytest.mark.parametrize("piece", ["master", "m", "generator", "order", "weights", "step", "scale", "next"])
@pytest.mark.parametrize("variant", list(ODD))
def test_an_odd_load_fails_its_check_and_crashes_nothing(reference_job, piece, variant):
    record, launcher, inputs, control = reference_job
    odd = copy.deepcopy(record.to_dict())
    loaded = odd["resume"]["results"][3]["loaded"]
    loaded[piece] = ODD[variant](loaded[piece])
    obs = launcher.observation([dict(r, job=odd) if i == 0 else r for i, r in enumerate(record.train)])
    with one_thread():
        checks = {c.name: c for c in SPEC.check(obs, control, inputs)}
    assert not checks["exact resume"].passed and "rank 3" in checks["exact resume"].message
    assert all(isinstance(c.message, str) and isinstance(c.diagnosis, str) for c in checks.values())


@pytest.mark.parametrize("what", ["no results", "an error", "a rank short", "no job at all"])
def test_a_missing_scenario_fails_and_crashes_nothing(reference_job, what):
    record, launcher, inputs, control = reference_job
    job = copy.deepcopy(record.to_dict())
    if what == "no results":
        job["reshard"]["results"] = None
    elif what == "an error":
        job["damaged"] = {"results": None, "error": "RuntimeError: boom", "reads": []}
    elif what == "a rank short":
        job["resume"]["results"] = job["resume"]["results"][:3]
    results = [dict(r, job=job) if i == 0 else r for i, r in enumerate(record.train)]
    if what == "no job at all":
        results[0] = {k: v for k, v in results[0].items() if k != "job"}
    with one_thread():
        checks = {c.name: c for c in SPEC.check(launcher.observation(results), control, inputs)}
    failed = {n for n, c in checks.items() if not c.passed}
    expected = {"no results": {"reshard 4 to 2"}, "an error": {"damaged checkpoint"}, "a rank short": {"exact resume"},
                "no job at all": {"exact resume", "crash points", "damaged checkpoint", "reshard 4 to 2"}}[what]
    assert failed == expected, {n: checks[n].message for n in failed}
