"""Finding the learner's code, running it on the simulated ranks, and grading what it did."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import traceback
from pathlib import Path

from puzzles import model, sim

from .result import ERROR, NOT_ATTEMPTED, PuzzleResult, status_of
from .spec import Observation, PuzzleSpec
from .specs import SPECS

REPO = Path(__file__).resolve().parent.parent
_counter = itertools.count()


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


def observe(spec: PuzzleSpec, module, inputs: dict, seed: int) -> Observation:
    """Run the learner's code for one puzzle on the simulator and collect what it did."""
    missing = [e for e in spec.entries if not hasattr(module, e)]
    if missing:
        raise TargetError(f"{spec.filename} defines no {', '.join(missing)}")
    args, rank_args = spec.launch(inputs)
    result = sim.run(spec.program(module), spec.world_size, args=args, rank_args=rank_args, cost=spec.cost,
                     seed=seed, timeout=spec.timeout, library_files=[model.__file__])
    return Observation.from_sim(result)


def grade_observation(spec: PuzzleSpec, obs: Observation, inputs: dict) -> PuzzleResult:
    checks = spec.check(obs, spec.reference(inputs), inputs)
    return PuzzleResult(spec.id, spec.name, spec.title, status_of(checks), checks, list(obs.peak_bytes),
                        obs.makespan, figures=figures_of(spec, obs, inputs))


def grade_module(spec: PuzzleSpec, module, seed: int) -> PuzzleResult:
    inputs = spec.make_inputs(seed)
    try:
        obs = observe(spec, module, inputs, seed)
    except NotImplementedError as exc:
        return PuzzleResult(spec.id, spec.name, spec.title, NOT_ATTEMPTED,
                            error=f"not attempted ({exc or 'the stub still raises NotImplementedError'})")
    except TargetError as exc:
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=str(exc))
    except Exception as exc:  # the learner's exception, or the simulator's (deadlock, mismatch, isolation, ...)
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR,
                            error=describe_exception(exc, getattr(module, "__file__", None)))
    return grade_observation(spec, obs, inputs)


def grade_target(target, puzzle_ids=None, seed: int = 0) -> list[PuzzleResult]:
    """Grade every puzzle (or those in `puzzle_ids`) of a folder laid out like puzzles/."""
    path = resolve_target(target)
    if path.suffix == ".ipynb":
        from .notebook import notebook_target

        with notebook_target(path) as folder:
            return [grade_file(spec, folder / spec.filename, seed) for spec in select(puzzle_ids)]
    return [grade_file(spec, path / spec.filename, seed) for spec in select(puzzle_ids)]


def grade_file(spec: PuzzleSpec, path: Path, seed: int) -> PuzzleResult:
    """Load one puzzle file and grade it. The spec's run context covers the import too, so that what a puzzle
    takes away (p1: torch.utils.checkpoint) cannot be imported by name before the run."""
    with spec.run_context():
        try:
            module = load_module(path)
        except TargetError as exc:
            status = NOT_ATTEMPTED if not path.exists() else ERROR
            return PuzzleResult(spec.id, spec.name, spec.title, status, error=str(exc))
        return grade_module(spec, module, seed)


def select(puzzle_ids=None) -> list[PuzzleSpec]:
    if not puzzle_ids:
        return list(SPECS.values())
    unknown = [p for p in puzzle_ids if p not in SPECS]
    if unknown:
        raise KeyError(f"unknown puzzle(s) {unknown}; known: {list(SPECS)}")
    return [SPECS[p] for p in puzzle_ids]


def figures_of(spec: PuzzleSpec, obs: Observation, inputs: dict) -> dict:
    """The data the plots are drawn from: per-rank memory timelines with the budget, and the schedule."""
    budgets = spec.budgets(inputs)
    memory_budget = budgets.get("peak memory")
    return {
        "ledgers": [{k: l[k] for k in ("rank", "peak", "peak_tick", "timeline", "peak_by_line")} for l in obs.ledgers],
        "memory_budget": memory_budget.value if memory_budget else None,
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
