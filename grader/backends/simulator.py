"""The simulator as a backend: run the learner's code for one puzzle on simulated ranks and collect what it did
as an Observation (then core/grading.py decides).

Each rank runs the spec's program on its own instance of the learner's module, as each real process does. A puzzle
graded on a job of several launches (p18: a failure, then a restart) runs them through `SimLauncher`.
Around every run: a fingerprint of the grader, the simulator and torch before the learner's file is loaded and
after it ran (tamper.py), and the memory ledgers' self-audit. Either finding makes the result "tampered"."""

from __future__ import annotations

from pathlib import Path

from puzzles import model, sim
from puzzles.simulator.modules import puzzle_modules

from ..core.grading import grade_observation, settle_imports
from ..core.result import ERROR, TAMPERED, PuzzleResult
from ..core.spec import Observation, PuzzleSpec
from .learner_code import (HARNESS_FILES, TargetError, check_entries, describe_exception, learner_source,
                           load_module_for_rank, load_puzzle, made_from_notebook, namespace_copy_for_rank,
                           not_implemented_result)
from .process_state import thread_hooks_changed
from .imports import describe_refused, refused_imports, refused_in_module, screened
from .tamper import Fingerprint, describe, describe_internals, internals_used, untampered


class Tampered(Exception):
    """The run's own figures do not hold together (a ledger written to from outside its bookkeeping)."""


def audit(result, spec: PuzzleSpec, cost=None) -> list[str]:
    """What is inconsistent in a finished run's figures: the ledgers' self-audit, and the cost model (`cost`, the
    run's: the spec's own unless its inputs set one, spec.cost_for)."""
    problems = [f"rank {r}'s memory ledger: {p}" for r, ledger in enumerate(result.ledgers) for p in ledger.audit()]
    expected = spec.cost if cost is None else cost
    if result.cost != expected:
        problems.append(f"the run's cost model {result.cost} is not the puzzle's {expected}")
    return problems + comm_problems(result.events, expected)


def comm_problems(events, cost) -> list[str]:
    """Each communication op on the clock took the ticks, and sent the bytes, that the puzzle's cost model gives an
    op of its kind, size and group (clock.py places every op so, and nothing else ever changes them): re-derived
    here from each event, so that a run whose communication was made cheaper on its way to the clock (its ticks or
    its bytes written, the cost model swapped for a while) is not a measurement. An all-to-all's time is set by
    its busiest rank, which one event does not show: its bytes are checked, not its ticks."""
    problems = []
    for e in events:
        if e.stream != "comm":
            continue
        peers = tuple(e.peers)
        if e.kind in ("send", "recv"):
            ticks, wire = cost.comm_ticks("send", e.nbytes, 2, ranks=peers), e.nbytes
        elif e.kind in ("all_to_all_single", "all_to_all"):
            ticks, wire = None, e.wire_bytes
        else:
            ticks = cost.comm_ticks(e.kind, e.nbytes, len(peers), ranks=peers)
            wire = cost.wire_bytes(e.kind, e.nbytes, len(peers), ranks=peers)
        if (ticks is not None and e.end - e.start != ticks) or e.wire_bytes != wire:
            problems.append(f"rank {e.rank}'s {e.kind} of {e.nbytes:,} bytes at tick {e.start:,} took {e.end - e.start:,} "
                            f"ticks and sent {e.wire_bytes:,} bytes, where the puzzle's cost model gives "
                            f"{ticks if ticks is not None else e.end - e.start:,} ticks and {wire:,} bytes")
            if len(problems) >= 3:
                break
    return problems


def observe(spec: PuzzleSpec, module, inputs: dict, seed: int) -> Observation:
    """Run the learner's code for one puzzle on the simulator and collect what it did."""
    check_entries(spec, module)
    if spec.job_of_launches:  # several launches that share a disk (p18)
        return spec.job(SimLauncher(spec, module, inputs, seed), inputs)
    args, rank_args = spec.launch(inputs)
    cost = spec.cost_for(inputs)
    result = sim.run(None, spec.world_size, make_fn=rank_programs(spec, module), args=args, rank_args=rank_args,
                     cost=cost, seed=seed, timeout=spec.timeout, library_files=[model.__file__],
                     harness_files=HARNESS_FILES,
                     charge_imports=not made_from_notebook(getattr(module, "__file__", None)),
                     **spec.sim_options(inputs))
    problems = audit(result, spec, cost)
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


# --------------------------------------------------------------------------------------------------------------
# A job of several launches (p18): the launcher a spec's `job` runs its launches through. A launch is one sim.run
# of the spec's program, each rank with its own instance of the learner's module (a restarted process imports the
# file again), on a `Disk` that outlives it (puzzles/simulator/filesystem.py). A launch that must die runs with
# its crash point armed: it ends when the dead rank's partners wait for it, and what it leaves is on the disk.
# grader/backends/real/launches.py is the same launcher on real processes.


class LaunchError(Exception):
    """A launch that was to run through ended in the learner's error (its text says which)."""


class SimLauncher:
    """Runs a job's launches on simulated ranks; keeps the train launch's SimResult for the observation."""

    def __init__(self, spec: PuzzleSpec, module, inputs: dict, seed: int):
        self.spec, self.module, self.seed = spec, module, seed
        self.args, _ = spec.launch(inputs)
        self.first: sim.SimResult | None = None  # the first launch that ran through: its ledgers and timeline

    # ---- disks

    def new_disk(self) -> sim.Disk:
        return sim.Disk()

    def copy(self, disk: sim.Disk) -> sim.Disk:
        return disk.copy()

    def damage(self, disk: sim.Disk, path: str) -> None:
        disk.damage(path)

    def listing(self, disk: sim.Disk) -> dict:
        return disk.listing()

    def events(self, disk: sim.Disk) -> list[dict]:
        """Every change (and read) of the last launch on `disk`, in the order they happened."""
        return [e.to_dict() for e in disk.events if e.run == disk.runs]

    @staticmethod
    def tampered(what: str):
        raise Tampered(what)

    def reads(self, disk: sim.Disk) -> list[str]:
        """The files the last launch on `disk` opened for reading while it loaded, in order (even if it failed)."""
        return [e.path for e in disk.events if e.run == disk.runs and e.op == "read" and e.phase == "load"]

    # ---- launches

    def _run(self, launch, disk: sim.Disk, rank_args=None):
        module = None if launch.control else self.module
        path = getattr(module, "__file__", None)
        return sim.run(None, launch.world, make_fn=rank_programs(self.spec, module) if module is not None else
                       (lambda rank: self.spec.program(None)), args=(launch, disk, *self.args), rank_args=rank_args,
                       cost=self.spec.cost, seed=self.seed, timeout=self.spec.timeout,
                       library_files=[model.__file__], harness_files=HARNESS_FILES,
                       charge_imports=not made_from_notebook(path))

    def run(self, launch, disk: sim.Disk, rank_args=None) -> list:
        """Each rank's result of a launch that runs to its end; LaunchError if the learner's code fails."""
        disk.start_run(None)
        try:
            result = self._run(launch, disk, rank_args)
        except NotImplementedError:  # a function not written yet: the backend reports the puzzle as partial
            raise
        except Exception as exc:
            raise LaunchError(describe_exception(exc, getattr(self.module, "__file__", None))) from exc
        problems = audit(result, self.spec)
        if problems:
            raise Tampered("; ".join(problems))
        if self.first is None and not launch.control:
            self.first = result
        return result.results

    def die(self, launch, disk: sim.Disk) -> bool:
        """Run a launch in which a rank dies; True when it died where it was to (the disk holds what survived)."""
        disk.start_run(launch.crash)
        try:
            self._run(launch, disk)
        except (Exception, sim.RankCrashed) as exc:
            if disk.crashed is None:
                if isinstance(exc, NotImplementedError):
                    raise
                raise LaunchError(describe_exception(exc, getattr(self.module, "__file__", None))) from exc
            return True
        return False  # it ran to its end: the point was never reached

    learner_errors = (LaunchError,)

    @staticmethod
    def describe(exc: BaseException) -> str:
        return str(exc)

    def observation(self, results: list) -> Observation:
        """The train launch as the observation (its ledgers and timeline draw the plots), `results` per rank."""
        obs = Observation.from_sim(self.first)
        obs.results = results
        return obs
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
                            error=describe_exception(exc, getattr(module, "__file__", None), spec.id))


def observe_module(spec: PuzzleSpec, module, inputs: dict, seed: int,
                   before: Fingerprint | None = None) -> Observation | PuzzleResult:
    """Run the learner's code: what it did, or the PuzzleResult that says why there is nothing to grade."""
    with puzzle_modules(spec.modules):
        return _observe_module(spec, module, inputs, seed, before)


def _observe_module(spec, module, inputs, seed, before):
    settle_imports()
    if before is None:  # a module made elsewhere (a notebook's namespace): scan what source there is
        source = learner_source(module) or ""
        found = internals_used(source)
        if found:
            return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=describe_internals(found))
        refused = refused_in_module(module, spec.modules, spec.id)
        if refused:
            return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=describe_refused(refused))
        before = Fingerprint()
    return untampered(spec, before, _run(spec, module, inputs, seed))


def observe_file(spec: PuzzleSpec, path: Path, inputs: dict, seed: int, *, _scan=internals_used,
                 _imports=refused_imports, _fingerprint=Fingerprint, _load=load_puzzle, _run=_run,
                 _untampered=untampered, _settle=settle_imports):
    """Load one puzzle file and run it. The spec's run context covers the import too, so that what a puzzle
    takes away (p1: torch.utils.checkpoint) cannot be imported by name before the run; the fingerprint is taken
    before the import, so that changes made at import time count too.

    What this call uses is bound when it is defined (the keyword defaults), not looked up in this module when it
    runs: the learner's file is imported inside this very call, and a file that rebinds, say, observe_module must
    not reroute the call it runs in (the fingerprint then names the rebinding)."""
    with puzzle_modules(spec.modules):
        return _observe_file(spec, path, inputs, seed, _scan, _imports, _fingerprint, _load, _run, _untampered,
                             _settle)


def _observe_file(spec, path, inputs, seed, _scan, _imports, _fingerprint, _load, _run, _untampered, _settle):
    refused = screened(spec, path.read_text(), path.name, _scan=_scan, _imports=_imports) if path.exists() else None
    if refused is not None:
        return refused
    _settle()
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
