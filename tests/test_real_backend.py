"""The real backend (grader/backends/real/, grader/frontends/launch.py): the same answers on real torch.distributed processes.

What these tests hold the project to:
- every reference solution passes on gloo processes, with each puzzle's own world size;
- the simulator and gloo agree on every value and gradient, on peak memory (and what was alive at the peak), on
  the ledger's whole sequence of allocations and frees, on every communication op and on FLOPs, for the references
  and for the naive answers; and the checks that do not read the simulated clock give the same verdict and figure;
- the checks that read the simulated clock are reported as "simulator only", not failed and not dropped;
- a deadlock, a rank that raises and a rank that dies are reported (which rank, where), never hung, and no process
  is left behind;
- `torchrun -m grader.launch` grades on real processes too.

Each test starts as few process groups as it can (a group runs several puzzles in turn); with the forkserver warm,
a group starts in well under a second. Budget: about a minute on 2 cores. The references' and naive answers' parity
runs on four representative puzzles in `pytest tests` (FAST) and on every puzzle in `pytest tests -m slow` (p18's
job alone takes over a minute on gloo).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from real_backend_helpers import rank_dies, rank_raises, ranks_mismatch, receive_then_add

from grader.backends import real
from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_file, observe
from grader.core.grading import grade_observation
from grader.core.result import NOT_ATTEMPTED, PASS
from grader.frontends import cli
from grader.frontends.stubs import stub
from grader.frontends.targets import REPO, grade_target
from grader.specs import SPECS
from puzzles.simulator.memory import AT_IMPORT

pytestmark = [pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available"),
              pytest.mark.xdist_group("gloo-parity")]  # one worker grades the module's puzzles once

REPO = REPO
SEED = 0


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


# One of each kind: a collective written by the learner (p3), a pipeline of sends whose bubble only the clock
# measures (p5), asynchronous all-reduces (p7, whose naive answer fails only a clock check), worlds of 4 carved out
# of 8 ranks (p13).
FAST = ("p3", "p5", "p7", "p13")


def grade_on_both(folder: Path, puzzles):
    """Grade `puzzles` of `folder` on gloo (one group per world size) and on the simulator."""
    specs = [SPECS[p] for p in puzzles]
    outcomes = []
    results = real.grade_folder(folder, specs, SEED, outcomes_out=outcomes)
    rows = []
    for spec, result in zip(specs, results):
        outcome = next(o for o in outcomes if o.task.puzzle == spec.id)
        assert outcome.ok, f"{spec.id} on gloo: {outcome.error}"
        assert not any(alive(pid) for pid in outcome.pids)
        with spec.run_context():
            module = load_module(folder / spec.filename)
        inputs = spec.make_inputs(SEED)
        sim_obs = observe(spec, module, inputs, SEED)
        real_obs = real.observation(outcome.payloads)
        graded = grade_observation(spec, sim_obs, inputs)
        if spec.job_of_launches:  # p18: compare the first launch (outcome), each change to the disk but its time
            sim_obs, real_obs = first_launch(sim_obs), first_launch(real_obs)
        rows.append((spec, result, graded, sim_obs, real_obs))
    return rows


def first_launch(obs):
    """A job's observation as its first launch alone: the job's record left out, and the disk's changes without
    their place in time (the simulator's order of turns against real processes' clock)."""
    obs = copy.copy(obs)
    obs.results = [{k: ([{f: v for f, v in e.items() if f != "seq"} for e in value] if k == "disk" else value)
                    for k, value in r.items() if k != "job"} for r in obs.results]
    return obs


@pytest.fixture(scope="module", params=[pytest.param(FAST, id="some"),
                                        pytest.param(tuple(SPECS), id="every", marks=pytest.mark.slow)])
def puzzles(request):
    return request.param


@pytest.fixture(scope="module")
def references(puzzles):
    return grade_on_both(REPO / "solutions", puzzles)


@pytest.fixture(scope="module")
def naive(puzzles):
    return grade_on_both(REPO / "tests" / "naive", puzzles)


def assert_same_story(rows):
    for spec, real_result, sim_result, sim_obs, real_obs in rows:
        comparison = real.compare(sim_obs, real_obs)
        assert comparison.agree, f"{spec.id}: simulator and gloo differ:\n" + "\n".join(comparison.differences)
        assert comparison.max_relative_difference < 1e-12
        sim_checks = {c.name: c for c in sim_result.checks}
        for c in real_result.checks:
            if c.simulator_only:
                continue
            s = sim_checks[c.name]
            assert (c.passed, c.measured) == (s.passed, s.measured), \
                f"{spec.id} {c.name}: gloo says {c.passed} ({c.measured}), the simulator {s.passed} ({s.measured})"


def test_every_reference_passes_on_gloo(references):
    for spec, result, *_ in references:
        assert result.status == PASS, f"{spec.id} on gloo: " + "; ".join(
            f"{c.name}: {c.message}" for c in result.failed_checks()) + result.error


def test_the_clock_charges_the_learners_ops_on_received_buffers_and_not_gloos_delivery_copies():
    # An irecv's buffer is written by gloo's own thread, not by a copy_ in wait(): the first in-place op on it is
    # the learner's and is charged (p15's dq.add_ went uncharged on gloo when a received buffer's storage address
    # was reused). A reduce_scatter_tensor's output is delivered by a copy_ inside wait(): not charged.
    outcome = real.run(receive_then_add, 2)
    assert outcome.ok, outcome.error
    obs = real.observation(outcome.payloads)
    ops = [[e["op"] for e in obs.events_of(r, "compute")] for r in range(2)]
    assert ops[1].count("add_") == 1, f"rank 1's compute events: {ops[1]}"
    assert "copy_" not in ops[0] + ops[1], f"compute events: {ops}"


def test_references_tell_the_same_story_on_the_simulator_and_on_gloo(references):
    assert_same_story(references)


def test_naive_answers_tell_the_same_story_on_the_simulator_and_on_gloo(naive):
    assert_same_story(naive)


def test_clock_checks_are_reported_as_simulator_only(references, naive, puzzles):
    for spec, result, sim_result, *_ in references + naive:
        names = set(spec.simulator_only)
        for c in result.checks:
            assert c.simulator_only == (c.name in names), f"{spec.id} {c.name}"
            if c.simulator_only:
                assert c.passed and c.message.startswith("simulator only")
        assert {c.name for c in result.checks} == {c.name for c in sim_result.checks}, spec.id
    # p7's naive answer (synchronous all-reduces) fails only the makespan: a check real processes cannot make.
    p7 = next(r for s, r, *_ in naive if s.id == "p7")
    assert p7.status == PASS and [c.name for c in p7.checks if c.simulator_only] == ["makespan"]
    clock_based = {s.id: s.simulator_only for s, *_ in references if s.simulator_only}
    expected = {"p5": ("bubble",), "p6": ("bubble",), "p7": ("makespan",), "p10": ("makespan",), "p11": ("bubble",),
                "p13": ("ring makespan", "doubling makespan"), "p15": ("makespan",), "p16": ("bubble",),
                "p17": ("bubble",), "p21": ("no host sync", "overlap", "makespan"),
                "p23": ("balance", "makespan")}
    assert clock_based == {p: checks for p, checks in expected.items() if p in puzzles}


def test_a_hand_written_backward_is_read_alike_on_gloo():
    """p17's B before W reads a backward outside autograd off all the compute less the forwards, counted by the
    inputs received before each send: real processes lay compute end to end (a receive and the send before it on
    one tick), the simulator waits; both must say the same, for the wrong order and for the right one."""
    answers = [(SPECS["p17"], REPO / "tests" / "wrong" / "p17_hand_written_weights_before_send.py"),
               (SPECS["p17"], REPO / "tests" / "alternatives" / "p17_hand_written_backward.py")]
    verdicts = []
    for (spec, path), result in zip(answers, real.grade_files(answers, SEED)):
        order = next(c for c in result.checks if c.name == "B before W")
        on_sim = next(c for c in grade_file(spec, path, seed=SEED).checks if c.name == "B before W")
        assert (order.passed, order.measured, order.message) == (on_sim.passed, on_sim.measured, on_sim.message)
        verdicts.append(order.passed)
    assert verdicts == [False, True]


def test_deadlocks_are_reported_not_hung():
    wrong = REPO / "tests" / "wrong"
    tasks = [real.PuzzleTask("p3", str(wrong / "p3_deadlock_rank0_skips.py"), SEED),
             real.PuzzleTask("p5", str(wrong / "p5_deadlock_eager_last_stage.py"), SEED)]
    started = time.monotonic()
    skipped, eager = real.run_tasks(tasks, 4, timeout=3.0)
    assert time.monotonic() - started < 60
    assert skipped.status == eager.status == "error"
    line = next(i for i, text in enumerate((wrong / "p3_deadlock_rank0_skips.py").read_text().splitlines(), 1)
                if "dist.all_reduce" in text)  # where rank 0 waits
    assert "hung" in skipped.error and f"p3_deadlock_rank0_skips.py:{line}" in skipped.error
    assert "rank(s) [1, 2, 3] returned while others still wait" in skipped.error
    assert "hung" in eager.error and "ranks 2 and 3 both send first" in eager.error
    assert not any(alive(pid) for o in (skipped, eager) for pid in o.pids)


def test_a_rank_that_raises_dies_or_mismatches_is_named_and_nothing_is_left_running():
    tasks = [real.FunctionTask(rank_raises), real.FunctionTask(rank_dies), real.FunctionTask(ranks_mismatch)]
    raised, died, mismatched = real.run_tasks(tasks, 3, timeout=10.0)
    assert raised.status == "error" and raised.error.startswith("ValueError: boom on rank 1")
    assert "raised on rank 1 of 3" in raised.error and "rank 0: still running, at" in raised.error
    assert "dist.all_reduce" in raised.error  # where the others were stopped
    assert died.status == "error" and "rank 1 died" in died.error and "exit code 3" in died.error
    assert mismatched.status == "error" and "Detected mismatch between collectives" in mismatched.error
    assert "DETAIL fingerprints" in mismatched.error
    assert not any(alive(pid) for o in (raised, died, mismatched) for pid in o.pids)


def test_a_stub_is_not_attempted_on_gloo_too(tmp_path):
    """A stub of its own, made from the solution (the checkout's puzzles/ may hold a learner's answers)."""
    name = "p3_data_parallel.py"
    (tmp_path / name).write_text(stub((REPO / "solutions" / name).read_text(), name))
    [result] = grade_target(tmp_path, ["p3"], SEED, backend="torch")
    assert result.status == NOT_ATTEMPTED, result.error


def test_cli_backend_torch(capsys):
    code = cli.main(["check", "solutions", "-p", "p3", "--backend", "torch", "--seed", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "on torch.distributed (gloo" in out and "PASS" in out


def test_cli_world_size_must_fit_the_puzzle(capsys):
    code = cli.main(["check", "solutions", "-p", "p3", "--backend", "torch", "--world-size", "2"])
    assert code == 2
    assert "no puzzle here is written for 2 ranks" in capsys.readouterr().err


def test_launch_outside_torchrun_says_how(capsys, monkeypatch):
    from grader import launch

    monkeypatch.delenv("RANK", raising=False)
    assert launch.main(["p3", "--target", "solutions"]) == 2
    assert "torchrun --nproc-per-node N -m grader.launch" in capsys.readouterr().err


def test_torchrun_launch_grades_on_real_processes():
    torchrun = Path(sys.executable).with_name("torchrun")
    command = ([str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"])
    proc = subprocess.run(command + ["--nproc-per-node", "4", "-m", "grader.launch", "p3", "p6", "--target",
                                     "solutions", "--seed", "5"],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "torch.distributed (gloo, 4 processes started by torchrun)" in proc.stdout
    assert proc.stdout.count("PASS") == 2, proc.stdout
    assert "sim  bubble: simulator only" in proc.stdout


MODULE_LEVEL = '''
import torch

SCRATCH = torch.zeros({n}, dtype=torch.float64)  # a module-level workspace


class Cache:
    kept = [torch.zeros(32, dtype=torch.float64)]  # 256 bytes on a class of the file


def helper(x, out=torch.zeros(16, dtype=torch.float64)):  # 128 bytes as a default argument
    return x
'''


def both_backends(tmp_path, n):
    name = "p3_data_parallel.py"
    (tmp_path / name).write_text((REPO / "solutions" / name).read_text() + MODULE_LEVEL.format(n=n))
    spec, outcomes = SPECS["p3"], []
    [on_gloo] = real.grade_files([(spec, tmp_path / name)], SEED, outcomes_out=outcomes)
    return grade_file(spec, tmp_path / name, SEED), on_gloo, outcomes[0]


def test_a_few_module_level_numbers_are_charged_on_both_backends(tmp_path):
    """A mask or a few constants at module level are fine, and are memory the rank holds from its start: both
    backends charge them (the simulator, every storage the file's lines make at import; the real backend, the
    tensors the module holds: globals, class attributes, default arguments)."""
    on_sim, on_gloo, outcome = both_backends(tmp_path, 64)
    assert on_sim.status == PASS and on_gloo.status == PASS, (on_sim.error, on_gloo.error)
    simulated = observe(SPECS["p3"], load_module(tmp_path / "p3_data_parallel.py"), SPECS["p3"].make_inputs(SEED),
                        SEED)
    for r in range(SPECS["p3"].world_size):
        for backend, ledger in (("simulator", simulated.ledgers[r]), ("gloo", outcome.payloads[r]["ledger"])):
            at_import = sum(e["bytes"] for e in ledger["peak_by_line"] if AT_IMPORT in e["site"])
            assert at_import == (64 + 32 + 16) * 8, f"rank {r} on the {backend}: {at_import} bytes charged at import"


def test_a_workspace_made_at_import_is_refused_on_both_backends(tmp_path):
    """A buffer made at module level would escape the budgets that measure from the call on (p1's checkpoints,
    p8's optimizer state): more than 1 KiB of them is an error that names it, on both backends."""
    on_sim, on_gloo, _ = both_backends(tmp_path, 4096)
    for backend, result in (("simulator", on_sim), ("gloo", on_gloo)):
        assert result.status == "error", (backend, result.status)
        assert "HiddenMemoryError" in result.error and "33,152 bytes of tensors at import" in result.error, result.error
        assert "make tensors inside your functions" in result.error, result.error


def test_the_comparison_takes_a_nan_for_a_nan_and_names_non_finite_entries_elsewhere():
    # p19 returns the norm of a step with a NaN injected: NaN on both backends is agreement, not a difference; a
    # NaN in another place is one (a tensor's NaNs once made every comparison False, which read as agreement).
    from grader.backends.real.compare import _walk

    out: list[str] = []
    nan = float("nan")
    assert _walk([nan, 1.0], [nan, 1.0], "norms", out, 1e-10) == 0.0 and not out
    assert _walk(torch.tensor([1.0, nan, float("inf")]), torch.tensor([1.0, nan, float("inf")]), "t", out, 1e-10) == 0
    assert not out
    assert _walk(torch.tensor([1.0, nan]), torch.tensor([nan, 1.0]), "g", out, 1e-10) == float("inf")
    assert out == ["g: non-finite entries in other places (simulator 1, real backend 1)"]
