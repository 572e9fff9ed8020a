"""The simulator as a backend: run the learner's code for one puzzle on simulated ranks and collect what it did
as an Observation (then core/grading.py decides).

Each rank runs the spec's program on its own instance of the learner's module, as each real process does.
Around every run: a fingerprint of the grader, the simulator and torch before the learner's file is loaded and
after it ran (tamper.py), and the memory ledgers' self-audit. Either finding makes the result "tampered"."""

from __future__ import annotations

from pathlib import Path

from puzzles import model, sim

from ..core.grading import grade_observation
from ..core.result import ERROR, TAMPERED, PuzzleResult
from ..core.spec import Observation, PuzzleSpec
from .learner_code import (HARNESS_FILES, TargetError, check_entries, describe_exception, learner_source,
                           load_module_for_rank, load_puzzle, made_from_notebook, namespace_copy_for_rank,
                           not_implemented_result)
from .process_state import thread_hooks_changed
from .tamper import Fingerprint, describe, describe_internals, internals_used, untampered


class Tampered(Exception):
    """The run's own figures do not hold together (a ledger written to from outside its bookkeeping)."""


def audit(result, spec: PuzzleSpec) -> list[str]:
    """What is inconsistent in a finished run's figures: the ledgers' self-audit, and the cost model."""
    problems = [f"rank {r}'s memory ledger: {p}" for r, ledger in enumerate(result.ledgers) for p in ledger.audit()]
    if result.cost != spec.cost:
        problems.append(f"the run's cost model {result.cost} is not the puzzle's {spec.cost}")
    return problems


def observe(spec: PuzzleSpec, module, inputs: dict, seed: int) -> Observation:
    """Run the learner's code for one puzzle on the simulator and collect what it did."""
    check_entries(spec, module)
    args, rank_args = spec.launch(inputs)
    result = sim.run(None, spec.world_size, make_fn=rank_programs(spec, module), args=args, rank_args=rank_args,
                     cost=spec.cost, seed=seed, timeout=spec.timeout, library_files=[model.__file__],
                     harness_files=HARNESS_FILES,
                     charge_imports=not made_from_notebook(getattr(module, "__file__", None)))
    problems = audit(result, spec)
    if problems:
        raise Tampered("; ".join(problems))
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
        _no_hooks(rank)
        program = spec.program(mine)

        def run(*args):
            out = program(*args)
            _no_hooks(rank)  # (the spec's own code ran after the learner's, in this thread)
            return out

        return run

    return make


def _no_hooks(rank: int) -> None:
    """A rank's thread runs the simulator's and the spec's code too: a profile or trace hook its code installed
    there would see (and could rewrite) what they measure. Cleared, and the run is tampered."""
    found = thread_hooks_changed()
    if found:
        raise Tampered(f"rank {rank}: " + "; ".join(found))


def _run(spec: PuzzleSpec, module, inputs: dict, seed: int) -> Observation | PuzzleResult:
    try:
        return observe(spec, module, inputs, seed)
    except NotImplementedError as exc:
        return not_implemented_result(spec, module, exc)
    except TargetError as exc:
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=str(exc))
    except Tampered as exc:
        return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=describe([str(exc)]))
    except Exception as exc:  # the learner's exception, or the simulator's (deadlock, mismatch, isolation, ...)
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR,
                            error=describe_exception(exc, getattr(module, "__file__", None)))


def observe_module(spec: PuzzleSpec, module, inputs: dict, seed: int,
                   before: Fingerprint | None = None) -> Observation | PuzzleResult:
    """Run the learner's code: what it did, or the PuzzleResult that says why there is nothing to grade."""
    if before is None:  # a module made elsewhere (a notebook's namespace): scan what source there is
        found = internals_used(learner_source(module) or "")
        if found:
            return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=describe_internals(found))
        before = Fingerprint()
    return untampered(spec, before, _run(spec, module, inputs, seed))


def observe_file(spec: PuzzleSpec, path: Path, inputs: dict, seed: int, *, _scan=internals_used,
                 _fingerprint=Fingerprint, _load=load_puzzle, _run=_run, _untampered=untampered):
    """Load one puzzle file and run it. The spec's run context covers the import too, so that what a puzzle
    takes away (p1: torch.utils.checkpoint) cannot be imported by name before the run; the fingerprint is taken
    before the import, so that changes made at import time count too.

    What this call uses is bound when it is defined (the keyword defaults), not looked up in this module when it
    runs: the learner's file is imported inside this very call, and a file that rebinds, say, observe_module must
    not reroute the call it runs in (the fingerprint then names the rebinding)."""
    found = _scan(path.read_text(), path.name) if path.exists() else []
    if found:
        return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=describe_internals(found))
    with spec.run_context():
        before = _fingerprint()
        module = _load(spec, path)
        before.unhook()  # a hook the import installed would watch the grader's every call from here on
        if isinstance(module, PuzzleResult):
            return _untampered(spec, before, module)
        return _untampered(spec, before, _run(spec, module, inputs, seed))


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
