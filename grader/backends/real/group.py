"""The parent side of a real group: start N processes (rank.py), collect each task, and report hangs, crashes and
errors (reports.py). Every path ends with every process gone."""

from __future__ import annotations

import contextlib
import datetime
import linecache
import multiprocessing.connection
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from puzzles.simulator.clock import CostModel

from ...core.spec import Observation
from .disk import CRASH_EXIT
from .rank import STARTUP_TIMEOUT, FunctionTask, _child_main
from .reports import _first_line, _tail, classify, describe_errors, describe_hang

DEFAULT_TIMEOUT = 60.0  # seconds one puzzle may take on the real backend (the spec's own timeout, if larger)
HANG_GRACE = 3.0  # after the time limit: seconds for the ranks to report gloo's own timeout before the kill
ERROR_GRACE = 2.0  # after a rank raised: seconds for the others to finish or raise before they are stopped
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

# --------------------------------------------------------------------------------------------------------------
# The parent side: start a group, collect each task, and report hangs, crashes and errors.


@dataclass
class TaskOutcome:
    """What became of one task: every rank's payload, or what went wrong (`status` error / not_attempted)."""

    task: object
    world_size: int
    payloads: list | None = None
    status: str = "ok"  # ok | error | not_attempted
    error: str = ""
    wall_s: float = 0.0  # from the task's start (the group's, for the first) to its last rank's report
    startup_s: float = 0.0  # the group's start (processes, imports, store) when this task was the group's first
    pids: list = field(default_factory=list)  # the group's processes (all gone by the time this is returned)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _start_method(preferred=None) -> str:
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    if preferred:
        return preferred
    return "forkserver" if "forkserver" in methods else "spawn"


def _context(method: str):
    import torch.multiprocessing as mp

    ctx = mp.get_context(method)
    if method == "forkserver":
        # The server imports torch and the grader once; every later group forks from it in milliseconds. Autograd
        # imports symbolic_shapes (and sympy: half a second) on a process's first backward: do that once too.
        ctx.set_forkserver_preload(["grader.backends.real.rank", "grader.specs",
                                  "torch.fx.experimental.symbolic_shapes"])
    return ctx


def _exit_reason(code) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Group:
    """N processes running a list of tasks; always closed (every process gone, the folder removed)."""

    def __init__(self, tasks, world_size: int, backend: str, timeout: float, start_method=None, detail=True,
                 hang_grace: float = HANG_GRACE):
        self.tasks, self.world_size, self.backend, self.timeout = tasks, world_size, backend, timeout
        self.hang_grace = hang_grace
        self.detail = detail
        self.work = Path(tempfile.mkdtemp(prefix="grader-real-"))
        self.procs = []
        self.store = None
        self.method = _start_method(start_method)

    # ---- lifecycle

    def start(self) -> float:
        started = time.monotonic()
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT))  # port 0: the OS picks one
        ctx = _context(self.method)
        for r in range(self.world_size):
            p = ctx.Process(target=_child_main, name=f"grader-rank-{r}",
                            args=(r, self.world_size, "127.0.0.1", self.store.port, self.tasks, str(self.work),
                                  self.backend, self.timeout, self.detail), daemon=True)
            p.start()
            self.procs.append(p)
        deadline = started + STARTUP_TIMEOUT
        while not all((self.work / f"ready.r{r}").exists() for r in range(self.world_size)):
            dead = [r for r, p in enumerate(self.procs) if p.exitcode is not None]
            if dead:
                raise _GroupFailed(self._describe_dead(dead, "while starting"))
            if time.monotonic() > deadline:
                raise _GroupFailed(f"the {self.world_size} processes did not start within {STARTUP_TIMEOUT:g} s")
            self._pause()
        return time.monotonic() - started

    def close(self, broken: bool = False) -> None:
        """Release the processes (or, when the group is broken, kill them at once), then wait for every one."""
        if not broken:
            (self.work / "release").touch()
            stop = time.monotonic() + 2.0
            for p in self.procs:
                p.join(timeout=max(0.0, stop - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5.0)
            with contextlib.suppress(Exception):
                p.close()
        self.procs = []
        self.store = None
        shutil.rmtree(self.work, ignore_errors=True)

    def _pause(self) -> None:
        sentinels = [p.sentinel for p in self.procs if p.exitcode is None]
        if sentinels:
            multiprocessing.connection.wait(sentinels, timeout=0.01)
        else:
            time.sleep(0.01)

    # ---- one task

    def collect(self, k: int) -> tuple[list, str | None]:
        """Wait for every rank's report of task k. Returns (payloads by rank, None) or (payloads so far, the
        description of what went wrong); after an error the group must not be used again."""
        started = time.monotonic()
        deadline = started + self.timeout + self.hang_grace
        payloads: list = [None] * self.world_size
        first_error_at = None
        while True:
            for r in range(self.world_size):
                path = self.work / f"t{k}.r{r}.pt"
                if payloads[r] is None and path.exists():
                    payloads[r] = _load(path, r)
                    if "error" in payloads[r] and first_error_at is None:
                        first_error_at = time.monotonic()
            missing = [r for r in range(self.world_size) if payloads[r] is None]
            if not missing:
                if any("error" in p for p in payloads):
                    return payloads, self._describe_errors(k, payloads, [])
                return payloads, None
            dead = [r for r in missing if self.procs[r].exitcode is not None]
            planned = all(self.procs[r].exitcode == CRASH_EXIT for r in dead)  # a failure the task injected (p18)
            if dead and (not planned or len(dead) == len(missing)):  # (the others run on until they wait for it)
                return payloads, self._describe_dead(dead, f"in {self.tasks[k].describe()}", payloads)
            now = time.monotonic()
            if first_error_at is not None and now > first_error_at + ERROR_GRACE:
                return payloads, self._describe_errors(k, payloads, missing)
            if now > deadline:
                return payloads, self._describe_hang(k, payloads, missing)
            self._pause()

    def release(self, k: int) -> None:
        (self.work / f"go{k}").touch()

    # ---- what went wrong, in words

    def _stacks(self, ranks) -> dict[int, str]:
        """Ask the stuck ranks for their Python stacks (faulthandler, SIGUSR1) and read them from their logs."""
        if not hasattr(signal, "SIGUSR1"):
            return {}
        for r in ranks:
            with contextlib.suppress(Exception):
                os.kill(self.procs[r].pid, signal.SIGUSR1)
        time.sleep(0.3)
        return {r: self._log(r) for r in ranks}

    def _log(self, r: int) -> str:
        try:
            return (self.work / f"rank{r}.log").read_text(errors="replace")
        except OSError:
            return ""

    def _where(self, r: int, log: str, learner_file) -> str:
        """The learner's innermost line in rank r's last dumped stack, or ''."""
        dump = log.rsplit("Thread 0x", 1)[-1] if "Thread 0x" in log else log
        dump = dump.rsplit("Current thread", 1)[-1] if "Current thread" in dump else dump
        if learner_file:
            name = re.escape(os.path.abspath(learner_file))
            hits = re.findall(rf'File "{name}", line (\d+) in (\S+)', dump)
            if hits:  # faulthandler lists the innermost frame first
                line, func = hits[0]
                text = linecache.getline(learner_file, int(line)).strip()
                return f"{os.path.basename(learner_file)}:{line} in {func}: {text}"
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', dump)
        frames = [f for f in frames if not f[0].startswith((_TORCH_DIR, os.path.dirname(os.__file__)))
                  and "grader" + os.sep not in f[0]]
        if frames:
            path, line, func = frames[0]
            return f"{os.path.basename(path)}:{line} in {func}: {linecache.getline(path, int(line)).strip()}"
        return ""

    def _learner_file(self, k: int):
        return getattr(self.tasks[k], "path", None)

    def _positions(self, k: int, missing) -> dict[int, str]:
        stacks = self._stacks(missing) if missing else {}
        return {r: self._where(r, stacks.get(r, ""), self._learner_file(k)) for r in missing}

    def _describe_hang(self, k: int, payloads, missing) -> str:
        return describe_hang(self.tasks[k].describe(), payloads, self.backend, self.timeout,
                             self._positions(k, missing))

    def _describe_errors(self, k: int, payloads, missing) -> str:
        return describe_errors(self.tasks[k].describe(), payloads, self.backend, self.timeout,
                               self._positions(k, missing))

    def _describe_dead(self, dead, when, payloads=None) -> str:
        lines = []
        for r in dead:
            code = self.procs[r].exitcode
            tail = _tail(self._log(r))
            lines.append(f"rank {r} died {when} ({_exit_reason(code)}): the process ended without reporting"
                         + (f". Its last output:\n{tail}" if tail else ""))
        if payloads is not None:
            alive = [r for r in range(self.world_size) if payloads[r] is None and r not in dead]
            if alive:
                lines.append(f"rank(s) {alive} were stopped")
        return "\n".join(lines)


class _GroupFailed(Exception):
    pass



def _load(path: Path, rank: int) -> dict:
    """A rank's report. Only tensors and plain data are loaded (weights_only=True): the file is written by the
    rank's process, which ran the learner's code, and a full unpickle would run whatever code it names here."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:
        return {"rank": rank, "error_type": "UnloadableResult",
                "error": (f"UnloadableResult: the rank returned data the grader will not load ({type(exc).__name__}): "
                          f"return tensors and plain Python values (numbers, strings, lists, tuples, dicts) only")}


def observation(payloads, backend: str = "torch"):
    """Every rank's payload of one task as the Observation a simulated run gives (no clock: makespan 0)."""
    ledgers = [p["ledger"] for p in payloads]
    events = sorted((e for p in payloads for e in p["events"]), key=lambda e: (e["start"], e["rank"], e["stream"],
                                                                                e["end"]))
    return Observation([p["result"] for p in payloads], [l["peak"] for l in ledgers], ledgers, events, 0,
                       backend=backend)


def run_tasks(tasks, world_size: int, *, backend: str = "gloo", timeout: float = DEFAULT_TIMEOUT,
              start_method=None, detail: bool = True, hang_grace: float = HANG_GRACE) -> list[TaskOutcome]:
    """Run every task on one group of `world_size` processes (a fresh group after any failure) and return what
    each gave. Nothing is left running when this returns or raises. `detail`: TORCH_DISTRIBUTED_DEBUG=DETAIL
    (collective fingerprints checked across ranks; about twice the time of a collective-heavy puzzle). `hang_grace`:
    seconds past `timeout` for the ranks to report gloo's own timeout (a test that expects one, on a loaded machine)."""
    outcomes: list[TaskOutcome | None] = [None] * len(tasks)
    todo = list(range(len(tasks)))
    while todo:
        group = _Group([tasks[i] for i in todo], world_size, backend, timeout, start_method, detail, hang_grace)
        done_here = 0
        broken = True  # until every task of the group has been collected
        try:
            try:
                group_started = time.monotonic()
                startup = group.start()
            except _GroupFailed as exc:
                for i in todo:
                    outcomes[i] = TaskOutcome(tasks[i], world_size, status="error", error=str(exc))
                return outcomes
            started = group_started
            for k, i in enumerate(todo):
                payloads, problem = group.collect(k)
                wall = time.monotonic() - started
                outcome = TaskOutcome(tasks[i], world_size, payloads, wall_s=wall, startup_s=startup if k == 0 else 0,
                                      pids=[p.pid for p in group.procs])
                if problem is not None:
                    outcome.status = classify(payloads)
                    if outcome.status == "ok":  # a rank died or hung although the others all returned
                        outcome.status = "error"
                    outcome.error = problem if outcome.status == "error" else _first_line(
                        next(p["error"] for p in payloads if p is not None and "error" in p))
                outcomes[i] = outcome
                done_here += 1
                if problem is not None and any(p is None for p in payloads):
                    break  # some rank is stuck or gone: this group is finished
                group.release(k)
                started = time.monotonic()
            else:
                broken = False
        finally:
            group.close(broken)
        todo = todo[done_here:]
    return outcomes


def run(fn, world_size: int, *, args=(), rank_args=None, cost: CostModel | None = None, seed: int = 0,
        timeout: float = DEFAULT_TIMEOUT, backend: str = "gloo") -> TaskOutcome:
    """sim.run's twin on real processes: `fn(torch.distributed, *args, *rank_args[rank])` on `world_size` gloo
    processes. `fn` must be a module-level function (it is pickled by name)."""
    task = FunctionTask(fn, tuple(args), rank_args, seed, cost or CostModel())
    return run_tasks([task], world_size, backend=backend, timeout=timeout)[0]


