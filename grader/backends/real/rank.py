"""One process of a real group: it runs tasks (a puzzle, or a function) on its rank of torch.distributed, under
the tracker (tracker.py), and writes back plain data. The parent side is group.py."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import gc
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from puzzles import model
from puzzles.simulator import guards
from puzzles.simulator.clock import CostModel

from ...core import probe
from ..tamper import Fingerprint
from .tracker import ProcessTracker

STARTUP_TIMEOUT = 180.0  # seconds for the processes to start (importing torch on a busy machine is slow)

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
        from ...specs import SPECS
        from ..learner_code import load_module, made_from_notebook

        spec = SPECS[self.puzzle]
        with spec.run_context():
            self.before = Fingerprint()  # before the learner's file is loaded: import-time changes count too
            module = load_module(Path(self.path))
            # its module-level tensors are charged once the tracker exists (execute), unless it is a notebook's
            self.module = None if made_from_notebook(self.path) else module
            inputs = spec.make_inputs(self.seed)
            args, rank_args = spec.launch(inputs)
            per_rank = tuple(rank_args[rank]) if rank_args is not None else ()
            yield spec.program(module), (*args, *per_rank), spec.cost_for(inputs), self.path

    @property
    def harness_files(self) -> tuple:
        """The grader's own files: allocations there are marked [harness], as on the simulator."""
        from ..learner_code import HARNESS_FILES

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
    threads_allowed: bool = False  # (the differential corpus measures torch.distributed itself: allowed.py's
    #                                 rule against threads and processes is the grader's, not gloo's)

    @contextlib.contextmanager
    def prepared(self, rank: int, world_size: int):
        self.before = Fingerprint()
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


def tampering(task, tracker) -> list[str]:
    """What the run changed that a verdict rests on (grader, simulator, torch: backends/tamper.py), and what is
    inconsistent in the rank's ledger; each change is undone. [] for an honest run."""
    found = []
    before = getattr(task, "before", None)
    if before is not None:
        found = before.changes(Fingerprint(with_kernels=True))
        if found:
            before.restore()
    if tracker is not None:
        found += [f"rank {tracker.rank}'s memory ledger: {p}" for p in tracker.ledger.audit()]
    return found


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
            probe.install_process_tracker(lambda: tracker.ledger.current, lambda: len(tracker.ledger.timeline))
            default_device = torch.get_default_device() if device is not None else None
            try:
                if device is not None:
                    torch.set_default_device(device)
                guards.install(tracker.guard_caller, threads_allowed=getattr(task, "threads_allowed", False))
                with tracker:
                    tracker.charge_module(getattr(task, "module", None))
                    placed = tracker.place(tuple(args))
                    result = fn(dist, *placed)
                    tracker.storage.close_rank(rank)  # a storage resized in place since an op last showed it
                    tracker.ledger.close()  # what the rank holds as it returns, its inputs included
                    del placed
            finally:
                guards.uninstall(tracker.guard_caller)
                if device is not None:
                    torch.set_default_device(default_device)
                probe.install_process_tracker(None)
                if gc_was_enabled:
                    gc.enable()
            tracker.clock.close()
            return {"rank": rank, "result": portable(result), "ledger": tracker.ledger.to_dict(),
                    "events": [e.to_dict() for e in tracker.clock.events], "flops": tracker.flops,
                    "tampering": tampering(task, tracker), "run_s": time.perf_counter() - started}
    except BaseException as exc:  # the learner's error, gloo's timeout, a mismatch found by DETAIL's fingerprints
        from ..learner_code import describe_exception

        return {"rank": rank, "error": describe_exception(exc, learner_file), "error_type": type(exc).__name__,
                "traceback": traceback.format_exc(limit=-12), "run_s": time.perf_counter() - started,
                "waiting": tracker.waiting if tracker is not None else None, "tampering": tampering(task, None)}


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


