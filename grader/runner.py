"""Finding the learner's code, running it on the simulated ranks, and grading what it did."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import sys
import traceback
from pathlib import Path

import torch

from puzzles import model, sim

from .result import ERROR, NOT_ATTEMPTED, Check, PuzzleResult, status_of
from .spec import Observation, PuzzleSpec
from .specs import SPECS

REPO = Path(__file__).resolve().parent.parent
HARNESS_FILES = tuple(str(p) for p in Path(__file__).resolve().parent.rglob("*.py"))  # the grader's own code
_counter = itertools.count()


@contextlib.contextmanager
def one_thread():
    """The serial reference in one intra-op thread: the sizes are small, and OpenMP threads that contend with
    other work on a busy machine made it 30x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class TargetError(Exception):
    """The learner's file could not be loaded (missing, a syntax error, an import that fails)."""


def resolve_target(target: str | os.PathLike) -> Path:
    """'puzzles' and 'solutions' name this project's folders wherever it is run from; anything else is a path."""
    path = Path(target)
    if path.exists():
        return path
    if str(target) in ("puzzles", "solutions") and (REPO / str(target)).exists():
        return REPO / str(target)
    raise FileNotFoundError(f"no such target: {target} (give 'puzzles', 'solutions', a folder laid out like "
                            f"puzzles/, or a notebook such as puzzles.ipynb)")


def load_module(path: Path):
    """Import one puzzle file as a fresh module (never a cached one: the learner may have edited it)."""
    if not path.exists():
        raise TargetError(f"there is no {path.name} in {path.parent}")
    name = f"_graded_{path.stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # a syntax error, a failing import, an exception at import time
        raise TargetError(f"{path.name} could not be imported: {describe_exception(exc, path)}") from exc
    return module


def check_entries(spec: PuzzleSpec, module) -> None:
    missing = [e for e in spec.entries if not hasattr(module, e)]
    if missing:
        raise TargetError(f"{spec.filename} defines no {', '.join(missing)}")


def load_puzzle(spec: PuzzleSpec, path: Path):
    """The learner's module for `spec`, or the PuzzleResult that says why there is none (a missing file: not
    attempted; one that does not import or lacks a function: an error). Call it inside spec.run_context()."""
    try:
        module = load_module(path)
        check_entries(spec, module)
        return module
    except TargetError as exc:
        status = NOT_ATTEMPTED if not path.exists() else ERROR
        return PuzzleResult(spec.id, spec.name, spec.title, status, error=str(exc))


def observe(spec: PuzzleSpec, module, inputs: dict, seed: int) -> Observation:
    """Run the learner's code for one puzzle on the simulator and collect what it did."""
    check_entries(spec, module)
    args, rank_args = spec.launch(inputs)
    result = sim.run(spec.program(module), spec.world_size, args=args, rank_args=rank_args, cost=spec.cost,
                     seed=seed, timeout=spec.timeout, library_files=[model.__file__], harness_files=HARNESS_FILES)
    return Observation.from_sim(result)


def as_simulator_only(check: Check) -> Check:
    """A clock-based check on a real backend: reported, not failed, not dropped."""
    what = f" (budget {check.budget.describe()})" if check.budget else ""
    return Check(check.name, True, f"simulator only: this check reads the simulated clock{what}, which real "
                                   f"processes do not have; grade on the simulator (without --backend) for it",
                 budget=check.budget, simulator_only=True)


def grade_observation(spec: PuzzleSpec, obs: Observation, inputs: dict) -> PuzzleResult:
    with one_thread():
        checks = spec.check(obs, spec.reference(inputs), inputs)
    if obs.backend != "sim":
        checks = [as_simulator_only(c) if c.simulator_only or c.name in spec.simulator_only else c for c in checks]
    return PuzzleResult(spec.id, spec.name, spec.title, status_of(checks), checks, list(obs.peak_bytes),
                        obs.makespan, figures=figures_of(spec, obs, inputs))


def observe_module(spec: PuzzleSpec, module, inputs: dict, seed: int) -> Observation | PuzzleResult:
    """Run the learner's code: what it did, or the PuzzleResult that says why there is nothing to grade."""
    try:
        return observe(spec, module, inputs, seed)
    except NotImplementedError as exc:
        return PuzzleResult(spec.id, spec.name, spec.title, NOT_ATTEMPTED,
                            error=f"not attempted ({exc or 'the stub still raises NotImplementedError'})")
    except TargetError as exc:
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=str(exc))
    except Exception as exc:  # the learner's exception, or the simulator's (deadlock, mismatch, isolation, ...)
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR,
                            error=describe_exception(exc, getattr(module, "__file__", None)))


def observe_file(spec: PuzzleSpec, path: Path, inputs: dict, seed: int) -> Observation | PuzzleResult:
    """Load one puzzle file and run it. The spec's run context covers the import too, so that what a puzzle
    takes away (p1: torch.utils.checkpoint) cannot be imported by name before the run."""
    with spec.run_context():
        module = load_puzzle(spec, path)
        return module if isinstance(module, PuzzleResult) else observe_module(spec, module, inputs, seed)


def _graded(spec: PuzzleSpec, observed, inputs: dict) -> PuzzleResult:
    return observed if isinstance(observed, PuzzleResult) else grade_observation(spec, observed, inputs)


def grade_module(spec: PuzzleSpec, module, seed: int) -> PuzzleResult:
    inputs = spec.make_inputs(seed)
    return _graded(spec, observe_module(spec, module, inputs, seed), inputs)


def grade_file(spec: PuzzleSpec, path: Path, seed: int) -> PuzzleResult:
    inputs = spec.make_inputs(seed)
    return _graded(spec, observe_file(spec, path, inputs, seed), inputs)


def grade_target(target, puzzle_ids=None, seed: int = 0, backend: str = "sim", **real_options) -> list[PuzzleResult]:
    """Grade every puzzle (or those in `puzzle_ids`) of a folder laid out like puzzles/. backend "sim" (the
    simulator) or "torch" (real processes on torch.distributed: see real.py, which takes `real_options`)."""
    path = resolve_target(target)
    if backend == "sim":
        grade = lambda folder, specs: [grade_file(spec, folder / spec.filename, seed) for spec in specs]  # noqa: E731
    elif backend == "torch":
        from . import real

        grade = lambda folder, specs: real.grade_folder(folder, specs, seed, **real_options)  # noqa: E731
    else:
        raise KeyError(f"unknown backend {backend!r}: 'sim' or 'torch'")
    if path.suffix == ".ipynb":
        from .notebook import notebook_target

        with notebook_target(path) as folder:
            return grade(folder, select(puzzle_ids))
    return grade(path, select(puzzle_ids))


def select(puzzle_ids=None) -> list[PuzzleSpec]:
    if not puzzle_ids:
        return list(SPECS.values())
    unknown = [p for p in puzzle_ids if p not in SPECS]
    if unknown:
        raise KeyError(f"unknown puzzle(s) {unknown}; known: {list(SPECS)}")
    return [SPECS[p] for p in puzzle_ids]


def figures_of(spec: PuzzleSpec, obs: Observation, inputs: dict) -> dict:
    """The data the plots are drawn from: per-rank memory timelines with the budget, and the schedule."""
    return {
        "ledgers": [{k: l[k] for k in ("rank", "peak", "peak_tick", "timeline", "peak_by_line")} for l in obs.ledgers],
        "memory_budget": spec.memory_lines(inputs),
        "events": obs.events,
        "makespan": obs.makespan,
    }


def describe_exception(exc: BaseException, learner_file=None) -> str:
    """'ValueError: boom' plus the learner's own frames (file:line: code), and the simulator's note on the rank."""
    head = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    internal = (os.path.dirname(sim.__file__), os.path.dirname(os.path.dirname(traceback.__file__)),
                os.path.dirname(__file__), os.path.dirname(importlib.util.__file__))
    mine = [f for f in frames if learner_file and os.path.abspath(f.filename) == os.path.abspath(str(learner_file))]
    if not mine:
        mine = [f for f in frames if not f.filename.startswith(internal) and "site-packages" not in f.filename]
    lines = [head] + [f"  at {os.path.basename(f.filename)}:{f.lineno} in {f.name}: {(f.line or '').strip()}"
                      for f in mine[-4:]]
    lines += list(getattr(exc, "__notes__", []))
    return "\n".join(lines)
