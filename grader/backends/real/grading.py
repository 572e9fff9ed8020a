"""From the payloads of a real group to an Observation, and grading a folder on real processes."""

from __future__ import annotations

from pathlib import Path

from ...core.grading import grade_observation
from ...core.result import ERROR, TAMPERED, PuzzleResult
from ..learner_code import load_puzzle, not_implemented_result
from ..imports import screened
from ..tamper import Fingerprint, describe, untampered
from .group import observation, run_tasks
from .launches import LaunchError, LaunchNotImplemented, RealLauncher, TamperedLaunch
from .reports import raised_not_implemented
from .rank import PuzzleTask

# --------------------------------------------------------------------------------------------------------------
# Grading: payloads -> Observation (group.observation) -> core/grading.py.


def grade_folder(folder: Path, specs, seed: int, *, world_size: int | None = None, **options) -> list:
    """Grade the puzzle files of `folder` on real processes (grade_files' options)."""
    if world_size is not None:  # each puzzle's shards, inputs and budgets are sized for its own world size
        chosen = [s for s in specs if s.world_size == world_size]
        if not chosen:
            sizes = ", ".join(f"{s.id}: {s.world_size}" for s in specs)
            raise KeyError(f"no puzzle here is written for {world_size} ranks (ranks per puzzle: {sizes}); each "
                           f"puzzle's sizes and budgets fix its world size")
        specs = chosen
    return grade_files([(spec, folder / spec.filename) for spec in specs], seed, **options)


def grade_job(spec, path: Path, module, seed: int, **options) -> PuzzleResult:
    """A puzzle graded on a job of several launches (spec.job): each launch a group of real processes, on a
    folder that outlives them (launches.py)."""
    launcher = RealLauncher(spec, path, seed, options.get("dist_backend", "gloo"), options.get("timeout"),
                            options.get("start_method"))
    inputs = spec.make_inputs(seed)
    try:
        obs = spec.job(launcher, inputs)
    except TamperedLaunch as exc:
        return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=describe(list(exc.args[0])))
    except LaunchNotImplemented as exc:
        return not_implemented_result(spec, module, exc)
    except LaunchError as exc:
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=str(exc))
    finally:
        launcher.close()
        if options.get("outcomes_out") is not None:
            options["outcomes_out"].extend(launcher.outcomes)
    return grade_observation(spec, obs, inputs)


def grade_files(answers, seed: int, *, dist_backend: str = "gloo", timeout: float | None = None, start_method=None,
                outcomes_out: list | None = None) -> list[PuzzleResult]:
    """Grade each (spec, file) of `answers` on real processes: one group per world size, the files in turn. A file
    is checked as on the simulator before any process starts: internals named in its source, changes its import
    makes (the fingerprint), and what each rank reports tampered with."""
    results: list = [None] * len(answers)
    runnable, modules = [], {}
    for i, (spec, path) in enumerate(answers):
        refused = screened(spec, path.read_text(), path.name) if path.exists() else None
        if refused is not None:  # the same scans and the same sentences as on the simulator
            results[i] = refused
            continue
        with spec.run_context():  # load once here too: a file that does not import fails here, with its message
            before = Fingerprint()  # the learner's module-level code runs here, in the grader's own process
            loaded = untampered(spec, before, load_puzzle(spec, path))
        if isinstance(loaded, PuzzleResult):
            results[i] = loaded
        elif spec.job_of_launches:  # several launches, each its own group of processes (p18)
            results[i] = grade_job(spec, path, loaded, seed, dist_backend=dist_backend, timeout=timeout,
                                   start_method=start_method, outcomes_out=outcomes_out)
        else:
            runnable.append(i)
            modules[i] = loaded
    for n in sorted({answers[i][0].world_size for i in runnable}):
        group = [i for i in runnable if answers[i][0].world_size == n]
        tasks = [PuzzleTask(answers[i][0].id, str(answers[i][1]), seed) for i in group]
        limit = timeout or max(answers[i][0].timeout for i in group)
        outcomes = run_tasks(tasks, n, backend=dist_backend, timeout=limit, start_method=start_method)
        for i, outcome in zip(group, outcomes):
            spec = answers[i][0]
            if outcomes_out is not None:
                outcomes_out.append(outcome)
            tampered = [t for p in outcome.payloads or () if p for t in p.get("tampering", ())]
            if tampered:
                results[i] = PuzzleResult(spec.id, spec.name, spec.title, TAMPERED,
                                          error=describe(sorted(set(tampered))))
            elif outcome.status == "not_attempted":  # every rank stopped at a NotImplementedError: how far along?
                results[i] = not_implemented_result(spec, modules[i], raised_not_implemented(outcome.error))
            elif not outcome.ok:
                results[i] = PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=outcome.error)
            else:
                inputs = spec.make_inputs(seed)
                results[i] = grade_observation(spec, observation(outcome.payloads), inputs)
    return results
