"""A job of several launches on real processes (p18): the real twin of grader/backends/launches.py.

Each launch is a fresh group of processes (group.py's run_tasks: a restart is new processes, which import the
learner's file again), on a RealDisk, a folder on this machine's disk that outlives them (disk.py). A launch that
must die has its crash point armed: the process that reaches it ends with os._exit, the others run on until their
next collective with it fails (gloo: "Connection closed by peer"), and the folder holds what survived.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...core.spec import Observation, PuzzleSpec
from .disk import RealDisk
from .group import observation, run_tasks
from .reports import raised_not_implemented


class LaunchError(Exception):
    """A launch that was to run through ended in the learner's error (its text says which)."""


class TamperedLaunch(Exception):
    """A launch whose ranks report tampering (the grader, the simulator or torch changed): args[0], what."""


class LaunchNotImplemented(NotImplementedError):
    """A launch stopped at a function the learner has not written yet: the puzzle is partial, not wrong."""


@dataclass
class LaunchTask:
    """One launch of a job, for each process of its group: the spec's program on the learner's file, the launch,
    the disk, and (for a launch that starts from given pieces) this rank's pieces."""

    puzzle: str
    path: str
    seed: int
    launch: object
    disk: RealDisk
    rank_args: list | None = None

    @contextlib.contextmanager
    def prepared(self, rank: int, world_size: int):
        from ...specs import SPECS
        from ..learner_code import load_module, made_from_notebook
        from ..tamper import Fingerprint

        spec = SPECS[self.puzzle]
        with spec.run_context():
            self.before = Fingerprint()
            module = load_module(Path(self.path))
            self.module = None if made_from_notebook(self.path) else module
            args, _ = spec.launch(spec.make_inputs(self.seed))
            per_rank = tuple(self.rank_args[rank]) if self.rank_args is not None else ()
            yield spec.program(module), (self.launch, self.disk, *args, *per_rank), spec.cost, self.path

    @property
    def harness_files(self) -> tuple:
        from ..learner_code import HARNESS_FILES

        return HARNESS_FILES

    def describe(self) -> str:
        return f"{self.puzzle} ({os.path.basename(self.path)}), launch {self.launch.name!r}"


class RealLauncher:
    """Runs a job's launches on real processes; keeps the first launch's payloads for the observation."""

    learner_errors = (LaunchError,)

    def __init__(self, spec: PuzzleSpec, path: Path, seed: int, dist_backend: str = "gloo",
                 timeout: float | None = None, start_method=None):
        self.spec, self.path, self.seed = spec, path, seed
        self.dist_backend, self.start_method = dist_backend, start_method
        self.timeout = timeout or spec.timeout
        self.folder = tempfile.mkdtemp(prefix="grader-job-")
        self.first = None
        self.outcomes: list = []

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    # ---- disks

    def new_disk(self) -> RealDisk:
        return RealDisk.new(self.folder)

    def copy(self, disk: RealDisk) -> RealDisk:
        return disk.copy(self.folder)

    def damage(self, disk: RealDisk, path: str) -> None:
        disk.damage(path)

    def listing(self, disk: RealDisk) -> dict:
        return disk.listing()

    def events(self, disk: RealDisk) -> list[dict]:
        return [e.to_dict() for e in disk.events()]

    @staticmethod
    def tampered(what: str):
        raise TamperedLaunch([what])

    def reads(self, disk: RealDisk) -> list[str]:
        return [e.path for e in disk.events() if e.op == "read" and e.phase == "load"]

    # ---- launches

    def _outcome(self, launch, disk: RealDisk, rank_args=None):
        task = LaunchTask(self.spec.id, str(self.path), self.seed, launch, disk, rank_args)
        [outcome] = run_tasks([task], launch.world, backend=self.dist_backend, timeout=self.timeout,
                              start_method=self.start_method)
        self.outcomes.append(outcome)
        return outcome

    def run(self, launch, disk: RealDisk, rank_args=None) -> list:
        disk.start_run(None)
        outcome = self._outcome(launch, disk, rank_args)
        tampered = [t for p in outcome.payloads or () if p for t in p.get("tampering", ())]
        if tampered:
            raise TamperedLaunch(sorted(set(tampered)))
        if outcome.status == "not_attempted":
            raise LaunchNotImplemented(raised_not_implemented(outcome.error))
        if not outcome.ok:
            raise LaunchError(outcome.error)
        if self.first is None:
            self.first = outcome.payloads
        return [p["result"] for p in outcome.payloads]

    def die(self, launch, disk: RealDisk) -> bool:
        disk.start_run(launch.crash)
        outcome = self._outcome(launch, disk)
        if disk.crashed():
            return True
        if outcome.status == "not_attempted":
            raise LaunchNotImplemented(raised_not_implemented(outcome.error))
        if not outcome.ok:
            raise LaunchError(outcome.error)
        return False

    @staticmethod
    def describe(exc: BaseException) -> str:
        return str(exc)

    def observation(self, results: list) -> Observation:
        obs = observation(self.first)
        obs.results = results
        return obs
