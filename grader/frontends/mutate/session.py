"""One mutation run: for each puzzle, grade the reference (it must pass, and its run time sets the time limit),
make its mutants, grade them in children, and mark the reviewed equivalents."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...backends.simulator import grade_file
from ...core.result import PASS
from ...specs import select
from .equivalents import Equivalent, reason_for
from .operators import mutants as make_mutants
from .outcome import EQUIVALENT, KILLED, SURVIVED, Limits, Outcome
from .runner import grade_mutants
from .source import Source


@dataclass
class PuzzleRun:
    id: str
    title: str
    file: str
    outcomes: list[Outcome] = field(default_factory=list)
    error: str = ""  # why the puzzle could not be mutation-tested (no file, no regions, a failing reference)
    reference_seconds: float = 0.0
    reference_peak: list[int] = field(default_factory=list)  # bytes per rank
    reference_makespan: int = 0
    limits: Limits | None = None
    seconds: float = 0.0  # wall clock
    cpu_seconds: float = 0.0  # this process and its children, user and system: what a busy machine cannot inflate
    stale: list[Equivalent] = field(default_factory=list)  # entries for this puzzle that matched no mutant

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def kill_rate(self) -> float | None:
        """Killed over the mutants that are not equivalent (None when there are none)."""
        scored = len(self.outcomes) - self.count(EQUIVALENT)
        return self.count(KILLED) / scored if scored else None


def default_jobs() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except AttributeError:
        return max(1, min(8, os.cpu_count() or 1))


def mutate_puzzle(spec, folder: Path, seed: int, equivalents: list[Equivalent], jobs: int, operators=None,
                  memory_mb: int = 4096, progress=None) -> PuzzleRun:
    started, cpu = time.monotonic(), _cpu_seconds()
    path = folder / spec.filename
    run = PuzzleRun(spec.id, spec.title, str(path))
    if not path.exists():
        run.error = f"there is no {spec.filename} in {folder}"
        return run
    source = Source(path.read_text(), spec.filename)
    if not source.regions:
        run.error = f"{spec.filename} has no `# BEGIN SOLUTION` / `# END SOLUTION` region to mutate"
        return run
    t = time.monotonic()
    reference = grade_file(spec, path, seed)  # here, not in a child: it is trusted, and it warms every cache
    run.reference_seconds = time.monotonic() - t
    if reference.status != PASS:
        failed = ", ".join(c.name for c in reference.failed_checks()) or reference.error.splitlines()[0]
        run.error = f"the reference does not pass ({reference.status}: {failed}); mutants of it say nothing"
        return run
    run.reference_peak, run.reference_makespan = list(reference.peak_bytes), reference.makespan_ticks
    run.limits = Limits.from_reference(run.reference_seconds, memory_mb)
    mutants = make_mutants(source, spec.id, operators)
    if progress:
        progress.begin(spec.id, len(mutants))

    def judged(outcome: Outcome) -> None:  # as each mutant finishes, so that progress shows survivors at once
        reason = reason_for(outcome.mutant, equivalents)
        if reason and outcome.status == SURVIVED:
            outcome.status, outcome.detail = EQUIVALENT, reason
        elif reason and outcome.status == KILLED:
            outcome.listed_equivalent = reason
        if progress:
            progress.judged(outcome)

    run.outcomes = grade_mutants(spec, mutants, seed, run.limits, jobs, judged)
    if not operators:  # with every operator run, an entry that matched nothing is out of date
        run.stale = [e for e in equivalents if e.puzzle == spec.id and not any(e.matches(m) for m in mutants)]
    run.seconds, run.cpu_seconds = time.monotonic() - started, _cpu_seconds() - cpu
    return run


def _cpu_seconds() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def mutate_target(folder: Path, puzzle_ids, seed: int, equivalents: list[Equivalent], jobs: int | None = None,
                  operators=None, memory_mb: int = 4096, progress=None) -> list[PuzzleRun]:
    """Mutation-test every puzzle of `puzzle_ids` (all when empty) whose reference lies in `folder`.
    `progress` (command.Watch, or None) hears `begin(puzzle, number of mutants)` as a puzzle's mutants are made and
    `judged(outcome)` as each is judged. SIGTERM and SIGINT while mutants run raise
    KeyboardInterrupt after their children are killed (runner._Stop)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # before the first fork, and for the reference: see runner.py
    try:
        return [mutate_puzzle(spec, folder, seed, equivalents, jobs or default_jobs(), operators, memory_mb,
                              progress) for spec in select(puzzle_ids)]
    finally:
        torch.set_num_threads(threads)
