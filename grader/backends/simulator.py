"""The simulator as a backend: run the learner's code for one puzzle on simulated ranks and collect what it did
as an Observation (then core/grading.py decides)."""

from __future__ import annotations

from pathlib import Path

from puzzles import model, sim

from ..core.grading import grade_observation
from ..core.result import ERROR, NOT_ATTEMPTED, PuzzleResult
from ..core.spec import Observation, PuzzleSpec
from .learner_code import (HARNESS_FILES, TargetError, check_entries, describe_exception, load_module_for_rank,
                           load_puzzle, namespace_copy_for_rank)


def observe(spec: PuzzleSpec, module, inputs: dict, seed: int) -> Observation:
    """Run the learner's code for one puzzle on the simulator and collect what it did."""
    check_entries(spec, module)
    args, rank_args = spec.launch(inputs)
    result = sim.run(None, spec.world_size, make_fn=rank_programs(spec, module), args=args, rank_args=rank_args,
                     cost=spec.cost, seed=seed, timeout=spec.timeout, library_files=[model.__file__],
                     harness_files=HARNESS_FILES)
    return Observation.from_sim(result)


def rank_programs(spec: PuzzleSpec, module):
    """sim.run's make_fn: rank r runs the spec's program on its own instance of the learner's module, as each
    real process does (module-level state is per rank). A module loaded from a file is imported again for each
    rank; one without a file (the notebook's) is copied (learner_code.namespace_copy_for_rank says how)."""
    path = getattr(module, "__file__", None)

    def make(rank: int):
        if path is not None:
            mine = load_module_for_rank(Path(path))
            check_entries(spec, mine)
        else:
            mine = namespace_copy_for_rank(module, spec.entries)
        return spec.program(mine)

    return make


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


def grade_folder(folder: Path, specs, seed: int) -> list[PuzzleResult]:
    """Every puzzle of `specs` from a folder laid out like puzzles/."""
    return [grade_file(spec, folder / spec.filename, seed) for spec in specs]
