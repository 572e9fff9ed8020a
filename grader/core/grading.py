"""From an Observation to a PuzzleResult: run the spec's checks against the serial reference.

Every backend ends here: the simulator (backends/simulator.py), real processes (backends/real/) and a batch
child's saved observations (frontends/batch/) all hand this module plain data, and it decides the verdict.
"""

from __future__ import annotations

import contextlib
import gc
import secrets
import traceback

import torch

from .result import GRADER_ERROR, Check, PuzzleResult, status_of
from .spec import Observation, PuzzleSpec


def fresh_seed() -> int:
    """A new grading seed (printed with every result, so that `--seed` reproduces the run)."""
    return secrets.randbelow(1_000_000)


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


def settle_imports() -> None:
    """Put what the imports made (torch's and the grader's objects, about 200,000) out of the cyclic garbage
    collector's reach, once per process, before the first grading. None of it is garbage, yet every full collection
    walked all of it: measured on 2 cores, grading p3, p5, p13 and p19 took 8.9 s, and 3.5 s once settled. The
    batch's zygote does the same before it forks (frontends/batch/zygote.py). What is made later is collected as
    usual; the simulator turns the collector off during a run anyway (frees by reference counting only). Once is
    read off the collector itself (a module flag would be state the tamper fingerprint watches)."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


@contextlib.contextmanager
def no_cyclic_gc():
    """The cyclic garbage collector off for a burst of bookkeeping that makes many objects and no cycles (the
    tamper fingerprint): a collection in the middle would walk the whole heap for nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def as_simulator_only(check: Check) -> Check:
    """A clock-based check on a real backend: reported, not failed, not dropped."""
    what = f" (budget {check.budget.describe()})" if check.budget else ""
    return Check(check.name, True, f"simulator only: this check reads the simulated clock{what}, which real "
                                   f"processes do not have; grade on the simulator (without --backend) for it",
                 budget=check.budget, simulator_only=True)


def grader_error(spec: PuzzleSpec, exc: BaseException, doing: str) -> PuzzleResult:
    """The grader itself failed: say so plainly, and never as the answer's fault."""
    where = traceback.extract_tb(exc.__traceback__)[-3:]
    frames = "; ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} in {f.name}" for f in where)
    return PuzzleResult(spec.id, spec.name, spec.title, GRADER_ERROR,
                        error=f"the grader failed while {doing}: {type(exc).__name__}: {exc} ({frames}). This is a "
                              f"bug in the grader, not your answer's fault: please report it with the seed.")


def grade_observation(spec: PuzzleSpec, obs: Observation, inputs: dict) -> PuzzleResult:
    try:
        with one_thread():
            checks = spec.check(obs, spec.reference(inputs), inputs)
    except Exception as exc:  # a check or a diagnosis that crashed: the grader's failure
        return grader_error(spec, exc, f"checking {spec.id}")
    if obs.backend != "sim":
        checks = [as_simulator_only(c) if c.simulator_only or c.name in spec.simulator_only else c for c in checks]
    return PuzzleResult(spec.id, spec.name, spec.title, status_of(checks), checks, list(obs.peak_bytes),
                        obs.makespan, figures=figures_of(spec, obs, inputs))


def figures_of(spec: PuzzleSpec, obs: Observation, inputs: dict) -> dict:
    """The data the plots are drawn from: per-rank memory timelines with the budget, and the schedule."""
    return {
        "ledgers": [{k: l[k] for k in ("rank", "peak", "peak_tick", "timeline", "peak_by_line")} for l in obs.ledgers],
        "memory_budget": spec.memory_lines(inputs),
        "events": obs.events,
        "makespan": obs.makespan,
    }
