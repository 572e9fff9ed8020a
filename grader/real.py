"""The real backend: the same puzzle function, run by N operating-system processes on torch.distributed.

    python -m grader check solutions --backend torch          (gloo processes on this machine's CPU)
    torchrun --nproc-per-node 4 -m grader.launch p3 --target solutions   (a real cluster; see launch.py)

On the simulator, `dist` is the simulator's mirror of torch.distributed; here it is `torch.distributed` itself,
in N processes started with torch.multiprocessing, joined in one gloo process group (NCCL on GPUs). Each process
runs the spec's `program` exactly as a simulated rank does and sends back plain data, from which the parent
builds the same `Observation` the simulator gives, so `spec.check` grades both with the same code.

What each process measures, with the same definitions as the simulator (puzzles/sim_memory.py, sim_clock.py):
- **memory**: a TorchDispatchMode of its own (`ProcessTracker`) charges every storage an op materialises to the
  same `Ledger` class the simulator uses, with the same `StorageTracker`; the inputs are placed on the rank the
  same way (a private copy, charged as "input placed on the rank"). So peak memory is the same figure.
- **communication**: c10d's collectives are dispatcher ops (`c10d.allreduce_`, `c10d._allgather_base_`,
  `c10d.send`, ...), so the same mode sees each one, with its bytes, its group and whether autograd's backward
  issued it: the counts and volumes that the specs check. A blocking op goes to the backend on private copies of
  the learner's tensors (see `_through_private_buffers`: otherwise gloo's worker thread decides when a tensor
  leaves the ledger, and peaks change from run to run).
- **errors**: TORCH_DISTRIBUTED_DEBUG=DETAIL, so collectives that do not match across ranks fail with PyTorch's
  own fingerprints instead of hanging; each rank's error comes back with the learner's line; a rank blocked in a
  communication says which (kind, peer, line) when the backend's time limit fires.
- **compute**: FLOPs per op by the simulator's formulas, laid end to end in ticks: a rank's compute stream
  without the waits. FLOP counts are exact on real processes; the *timeline* is not.

What only the simulated clock can measure (makespan, bubble, overlap) is reported as "simulator only": real
processes on a shared CPU have no clock that means the same thing on every machine.

How a group runs: the parent hosts a TCPStore on a port the OS picks, starts N processes (a forkserver that has
already imported torch, so a group costs a fraction of a second after the first), and each process runs the
puzzles it is given one after another, each in a fresh process group (so a message a wrong answer left unmatched
cannot leak into the next puzzle). Results come back as files (torch.save, loaded with weights_only=True).
Every path ends with every process gone: a rank that raises, a rank that dies, a group that hangs past its time
limit (the hung ranks' Python stacks are dumped first, to say where each one waits).
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import gc
import linecache
import multiprocessing.connection
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from puzzles import model
from puzzles.sim_clock import CostModel

from . import probe

from .real_compare import Comparison, compare
from .real_tracker import ProcessTracker

__all__ = ["run", "run_tasks", "grade_folder", "observation", "PuzzleTask", "FunctionTask", "execute",
           "compare", "Comparison", "ProcessTracker", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 60.0  # seconds one puzzle may take on the real backend (the spec's own timeout, if larger)
STARTUP_TIMEOUT = 180.0  # seconds for the processes to start (importing torch on a busy machine is slow)
HANG_GRACE = 3.0  # after the time limit: seconds for the ranks to report gloo's own timeout before the kill
ERROR_GRACE = 2.0  # after a rank raised: seconds for the others to finish or raise before they are stopped
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

# --------------------------------------------------------------------------------------------------------------
# In each process: running one task (one puzzle, or a function) and returning plain data.


@dataclass
class PuzzleTask:
    """Grade one puzzle file: every process rebuilds the inputs from the seed (the same on every rank) and runs
    the spec's program on its own rank's arguments."""

    puzzle: str
    path: str
    seed: int

    @contextlib.contextmanager
    def prepared(self, rank: int, world_size: int):
        from .runner import load_module
        from .specs import SPECS

        spec = SPECS[self.puzzle]
        with spec.run_context():
            module = load_module(Path(self.path))
            inputs = spec.make_inputs(self.seed)
            args, rank_args = spec.launch(inputs)
            per_rank = tuple(rank_args[rank]) if rank_args is not None else ()
            yield spec.program(module), (*args, *per_rank), spec.cost, self.path

    @property
    def harness_files(self) -> tuple:
        """The grader's own files: allocations there are marked [harness], as on the simulator."""
        from .runner import HARNESS_FILES

        return HARNESS_FILES

    def describe(self) -> str:
        return f"{self.puzzle} ({os.path.basename(self.path)})"


@dataclass
class FunctionTask:
    """Run `fn(dist, *args, *rank_args[rank])`, as sim.run does (fn must be importable by name: a module-level
    function). For tests and for anyone who wants the real backend without a spec."""

    fn: object
    args: tuple = ()
    rank_args: list | None = None
    seed: int = 0
    cost: CostModel = field(default_factory=CostModel)

    @contextlib.contextmanager
    def prepared(self, rank: int, world_size: int):
        per_rank = tuple(self.rank_args[rank]) if self.rank_args is not None else ()
        yield self.fn, (*self.args, *per_rank), self.cost, getattr(sys.modules.get(self.fn.__module__), "__file__",
                                                                       None)

    def describe(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))


def portable(value):
    """What a rank returned, as plain data another process can load: tensors detached and on the CPU."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        return t.cpu() if t.device.type != "cpu" else t
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return tuple(portable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return type(value)(portable(v) for v in value)
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    return value


def execute(task, rank: int, world_size: int, device=None) -> dict:
    """Run one task on this process's rank, under the tracker. Never raises: an error comes back as data."""
    started = time.perf_counter()
    learner_file = getattr(task, "path", None)
    tracker = None
    try:
        with task.prepared(rank, world_size) as (fn, args, cost, learner_file):
            # As sim.run: rank r's random numbers are the simulator's rank r stream, one intra-op thread, and
            # frees by reference counting only (no cycle collector), so the ledger is the same on every run.
            torch.manual_seed((task.seed * 65_537 + rank) % (2**63))
            gc_was_enabled = gc.isenabled()
            gc.disable()
            tracker = ProcessTracker(rank, cost, [model.__file__], device, getattr(task, "harness_files", ()))
            probe.install_process_tracker(lambda: tracker.ledger.current)
            default_device = torch.get_default_device() if device is not None else None
            try:
                if device is not None:
                    torch.set_default_device(device)
                with tracker:
                    placed = tracker.place(tuple(args))
                    result = fn(dist, *placed)
                    tracker.ledger.close()  # what the rank holds as it returns, its inputs included
                    del placed
            finally:
                if device is not None:
                    torch.set_default_device(default_device)
                probe.install_process_tracker(None)
                if gc_was_enabled:
                    gc.enable()
            return {"rank": rank, "result": portable(result), "ledger": tracker.ledger.to_dict(),
                    "events": [e.to_dict() for e in tracker.clock.events], "flops": tracker.flops,
                    "run_s": time.perf_counter() - started}
    except BaseException as exc:  # the learner's error, gloo's timeout, a mismatch found by DETAIL's fingerprints
        from .runner import describe_exception

        return {"rank": rank, "error": describe_exception(exc, learner_file), "error_type": type(exc).__name__,
                "traceback": traceback.format_exc(limit=-12), "run_s": time.perf_counter() - started,
                "waiting": tracker.waiting if tracker is not None else None}


# --------------------------------------------------------------------------------------------------------------
# The process side of a group.


def device_for(backend: str, local_rank: int):
    """NCCL: each rank on its own GPU. gloo: the CPU (None)."""
    if backend != "nccl":
        return None
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def enable_debug_detail() -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: every collective first checks the ranks' fingerprints (op, shapes, dtypes),
    so a mismatch is an error naming both ranks instead of a hang or garbage. (torch reads the variable when
    torch.distributed is imported, which in a forkserver child has already happened: set the level too.)"""
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    with contextlib.suppress(Exception):
        dist.set_debug_level(dist.DebugLevel.DETAIL)


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies, whatever kills it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _write(path: Path, payload) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: the parent never reads half a file


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.005)


def _child_main(rank: int, world_size: int, host: str, port: int, tasks: list, workdir: str, backend: str,
                timeout: float, detail: bool = True) -> None:
    work = Path(workdir)
    log = open(work / f"rank{rank}.log", "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    _die_with_parent()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    code = 0
    try:
        if detail:
            enable_debug_detail()
        torch.set_num_threads(1)
        device = device_for(backend, rank)
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT))
        (work / f"ready.r{rank}").touch()
        for k, task in enumerate(tasks):
            dist.init_process_group(backend, store=dist.PrefixStore(f"task{k}/", store), rank=rank,
                                    world_size=world_size, timeout=datetime.timedelta(seconds=timeout))
            payload = execute(task, rank, world_size, device)
            sys.stdout.flush()
            sys.stderr.flush()
            _write(work / f"t{k}.r{rank}.pt", payload)
            _wait_for(work / f"go{k}")  # the parent says so once every rank has reported this task
            dist.destroy_process_group()
        _wait_for(work / "release")
    except BaseException:  # the launcher's own failure (the store, init_process_group): say so in the log
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter teardown: it is slow, and nothing is left to clean


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
        ctx.set_forkserver_preload(["grader.real", "grader.runner", "torch.fx.experimental.symbolic_shapes"])
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

    def __init__(self, tasks, world_size: int, backend: str, timeout: float, start_method=None, detail=True):
        self.tasks, self.world_size, self.backend, self.timeout = tasks, world_size, backend, timeout
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
        deadline = started + self.timeout + HANG_GRACE
        payloads: list = [None] * self.world_size
        first_error_at = None
        while True:
            for r in range(self.world_size):
                path = self.work / f"t{k}.r{r}.pt"
                if payloads[r] is None and path.exists():
                    payloads[r] = _load(path)
                    if "error" in payloads[r] and first_error_at is None:
                        first_error_at = time.monotonic()
            missing = [r for r in range(self.world_size) if payloads[r] is None]
            if not missing:
                if any("error" in p for p in payloads):
                    return payloads, self._describe_errors(k, payloads, [])
                return payloads, None
            dead = [r for r in missing if self.procs[r].exitcode is not None]
            if dead:
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


# --------------------------------------------------------------------------------------------------------------
# What went wrong in a group, in words (shared by the multiprocessing launcher and torchrun's launch.py).


def _states(payloads, positions: dict) -> list[str]:
    """One line per rank: returned, raised (where), gave up waiting (for what, where), or still running (where)."""
    lines, seen = [], {}
    for r, p in enumerate(payloads):
        if p is None:
            where = positions.get(r, "")
            lines.append(f"  rank {r}: still running" + (f", at {where}" if where else ""))
        elif "error" not in p:
            lines.append(f"  rank {r}: returned")
        elif p.get("waiting") and _is_timeout(p["error"]):
            lines.append(f"  rank {r}: gave up waiting (a deadlock?) in {_waiting_text(p['waiting'])}")
        else:
            head = _first_line(p["error"])
            if head in seen:
                lines.append(f"  rank {r}: raised the same error as rank {seen[head]}")
            else:
                seen[head] = r
                short = head if len(head) <= 200 else head[:197] + "..."
                lines.append(f"  rank {r}: raised {short}" + _at(p["error"]))
    return lines


def _hang_hints(payloads) -> list[str]:
    hints = []
    waits = {r: p["waiting"] for r, p in enumerate(payloads) if p is not None and p.get("waiting")}
    for a, wa in waits.items():
        for b, wb in waits.items():
            if a < b and wa["kind"] == wb["kind"] == "send" and wa["peer"] == b and wb["peer"] == a:
                hints.append(f"ranks {a} and {b} both send first: a blocking send waits for the matching "
                             f"recv, so one side must receive first (or use isend/irecv, or batch_isend_irecv).")
    running = [r for r, p in enumerate(payloads) if p is None]
    if running:
        hints.append(f"rank(s) {running} never reached a communication that would let the others go on: an "
                     f"endless loop, or more work than the time limit allows (--timeout)?")
    returned = [r for r, p in enumerate(payloads) if p is not None and "error" not in p]
    if returned:
        hints.append(f"rank(s) {returned} returned while others still wait for them: did a rank skip a send, "
                     f"recv or collective that its partners make?")
    hints.append("(The simulator reports a deadlock as soon as it happens, naming what each rank waits for: "
                 "grade without --backend to see it there.)")
    return hints


def describe_hang(what: str, payloads, backend: str, timeout: float, positions=None) -> str:
    head = (f"the process group hung: {what} did not finish within {timeout:g} s on {len(payloads)} real "
            f"processes ({backend}, TORCH_DISTRIBUTED_DEBUG=DETAIL):")
    return "\n".join([head] + _states(payloads, positions or {}) + _hang_hints(payloads))


def describe_errors(what: str, payloads, backend: str, timeout: float, positions=None) -> str:
    """The first rank's own error (not a time limit, not a peer gone), with what each other rank was doing; or,
    when every error is a time limit, the hang."""
    errors = [(r, p) for r, p in enumerate(payloads) if p is not None and "error" in p]
    primary = [(r, p) for r, p in errors if not _is_timeout(p["error"]) and not _is_secondary(p["error"])]
    if not primary:  # every error is a time limit (gloo's own, or DETAIL's monitored barrier): a hang
        return describe_hang(what, payloads, backend, timeout, positions)
    r, p = primary[0]
    text = p["error"]
    if "Detected mismatch between collectives" in text:
        text += ("\n(torch.distributed's DETAIL fingerprints: the ranks met in collectives with different ops, "
                 "shapes or dtypes. Every rank of a group must make the same collective calls, with tensors of "
                 "the same shape and dtype, in the same order.)")
    others = [line for line in _states(payloads, positions or {}) if not line.startswith(f"  rank {r}:")]
    note = (f"(raised on rank {r} of {len(payloads)}, a real process on torch.distributed with "
            f"{backend}{'; the other ranks:' if others else ''})")
    return "\n".join([text, note] + others)


def classify(payloads) -> str:
    """'ok', 'not_attempted' (every error is the stub's NotImplementedError) or 'error'."""
    errors = [p for p in payloads if p is None or "error" in p]
    if not errors:
        return "ok"
    if all(p is not None and p["error_type"] == "NotImplementedError" for p in errors):
        return "not_attempted"
    return "error"


def _load(path: Path) -> dict:
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # a rank returned something that is not plain data; the file is our own child's
        return torch.load(path, weights_only=False)


def _is_timeout(text: str) -> bool:
    """gloo's own time limit, or DETAIL's monitored barrier that some ranks never reached."""
    return (bool(re.search(r"[Tt]imed out|timeout|failed to pass monitoredBarrier", text))
            and "Detected mismatch" not in text)


def _is_secondary(text: str) -> bool:
    """An error a rank got because another rank went away (not its own mistake)."""
    return bool(re.search(r"Connection closed by peer|Connection reset|Broken pipe|ECONNRESET", text))


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _at(text: str) -> str:
    """' at p3.py:18 in step: dist.all_reduce(g)': the learner's innermost line in a described exception."""
    at = [line.strip() for line in text.splitlines() if line.strip().startswith("at ")]
    return f" {at[-1]}" if at else ""


def _waiting_text(w: dict) -> str:
    peer = f" {'to' if w['kind'] == 'send' else 'from'} rank {w['peer']}" if w.get("peer") is not None else ""
    return f"{w['kind']}{peer} at {w['site']}"


def _tail(text: str, n: int = 15) -> str:
    lines = [line for line in text.splitlines() if line.strip() and "FutureWarning" not in line
             and "return func(*args, **kwargs)" not in line]
    return "\n".join("    " + line for line in lines[-n:])


def run_tasks(tasks, world_size: int, *, backend: str = "gloo", timeout: float = DEFAULT_TIMEOUT,
              start_method=None, detail: bool = True) -> list[TaskOutcome]:
    """Run every task on one group of `world_size` processes (a fresh group after any failure) and return what
    each gave. Nothing is left running when this returns or raises. `detail`: TORCH_DISTRIBUTED_DEBUG=DETAIL
    (collective fingerprints checked across ranks; about twice the time of a collective-heavy puzzle)."""
    outcomes: list[TaskOutcome | None] = [None] * len(tasks)
    todo = list(range(len(tasks)))
    while todo:
        group = _Group([tasks[i] for i in todo], world_size, backend, timeout, start_method, detail)
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


# --------------------------------------------------------------------------------------------------------------
# From payloads to an Observation, and grading.


def observation(payloads, backend: str = "torch"):
    from .spec import Observation

    ledgers = [p["ledger"] for p in payloads]
    events = sorted((e for p in payloads for e in p["events"]), key=lambda e: (e["start"], e["rank"], e["stream"],
                                                                                e["end"]))
    return Observation([p["result"] for p in payloads], [l["peak"] for l in ledgers], ledgers, events, 0,
                       backend=backend)


def grade_folder(folder: Path, specs, seed: int, *, dist_backend: str = "gloo", world_size: int | None = None,
                 timeout: float | None = None, start_method=None, outcomes_out: list | None = None) -> list:
    """Grade the puzzle files of `folder` on real processes: one group per world size, each puzzle in turn."""
    from .result import ERROR, NOT_ATTEMPTED, PuzzleResult
    from .runner import grade_observation, load_puzzle

    if world_size is not None:  # each puzzle's shards, inputs and budgets are sized for its own world size
        chosen = [s for s in specs if s.world_size == world_size]
        if not chosen:
            sizes = ", ".join(f"{s.id}: {s.world_size}" for s in specs)
            raise KeyError(f"no puzzle here is written for {world_size} ranks (ranks per puzzle: {sizes}); each "
                           f"puzzle's sizes and budgets fix its world size")
        specs = chosen
    results: dict[str, PuzzleResult] = {}
    runnable = []
    for spec in specs:
        with spec.run_context():  # load once here too: a file that does not import fails here, with its message
            loaded = load_puzzle(spec, folder / spec.filename)
        if isinstance(loaded, PuzzleResult):
            results[spec.id] = loaded
        else:
            runnable.append(spec)
    for n in sorted({s.world_size for s in runnable}):
        group = [s for s in runnable if s.world_size == n]
        tasks = [PuzzleTask(s.id, str(folder / s.filename), seed) for s in group]
        limit = timeout or max(s.timeout for s in group)
        outcomes = run_tasks(tasks, n, backend=dist_backend, timeout=limit, start_method=start_method)
        for spec, outcome in zip(group, outcomes):
            if outcomes_out is not None:
                outcomes_out.append(outcome)
            if outcome.status == "not_attempted":
                results[spec.id] = PuzzleResult(spec.id, spec.name, spec.title, NOT_ATTEMPTED,
                                                error=f"not attempted ({outcome.error})")
            elif not outcome.ok:
                results[spec.id] = PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=outcome.error)
            else:
                inputs = spec.make_inputs(seed)
                results[spec.id] = grade_observation(spec, observation(outcome.payloads), inputs)
    return [results[s.id] for s in specs]


