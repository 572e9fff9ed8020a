"""A job of several launches on the simulator: the launcher a spec's `job` runs its launches through (p18).

A launch is one sim.run of the spec's program, each rank with its own instance of the learner's module (a
restarted process imports the file again), on a `Disk` that outlives the launch (puzzles/simulator/filesystem.py).
A launch that must die is run with its crash point armed: it ends when the dead rank's partners wait for it, and
what it leaves is on the disk. grader/backends/real/launches.py is the same launcher on real processes.
"""

from __future__ import annotations

from puzzles import model, sim

from ..core.spec import Observation, PuzzleSpec
from .learner_code import HARNESS_FILES, describe_exception, made_from_notebook
from .simulator import Tampered, audit, rank_programs


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


def observe_job(spec: PuzzleSpec, module, inputs: dict, seed: int) -> Observation:
    """Run the learner's code for a puzzle graded on a job of several launches (spec.job) on the simulator."""
    return spec.job(SimLauncher(spec, module, inputs, seed), inputs)
