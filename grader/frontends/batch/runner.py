"""The puzzle's own process in `batch`: enter the jail, run one puzzle of one submission, write what it observed.

It only observes: what the learner's functions returned and what the simulator's ledger and clock recorded, as
tensors and plain data (record.py, no pickle). The batch's parent parses that, checks its shape,
computes the reference itself and decides the verdict. Whatever this process reports about itself (its record,
its findings) is evidence, not a verdict.

The record leaves through code bound when the zygote imported this module, before any learner's code: a file that
replaces os.write, json.dumps or the record's own functions at import changes nothing on the way out (and the
fingerprint, which watches os, sys, json and the grader, names the replacement). Before the record is built, the
profile and trace hooks the learner's code installed are cleared, and torch's modes and kernels put back.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import sys
import tempfile
import threading
from pathlib import Path

from ...backends.process_state import ProcessState
from ...backends.tamper import Fingerprint
from ..targets import REPO
from . import record as record_format
from . import sandbox

JAILED = b"J"  # the first byte on the record pipe: the jail was entered, and what follows is the learner's doing


def warm_up() -> None:
    """In the zygote, before any fork: pay once for what the first run of a puzzle would import, compile or cache
    (the dispatch mode, autograd, the collectives, torch's first use of each op), so that no puzzle's process pays
    it again. Running the naive answers (tests/naive/, wrong on purpose, never the solutions) covers each puzzle's
    own ops: measured, it cut a solution's puzzle from 0.23 to 0.08 s of CPU. Every thread it starts is joined
    and nothing of those answers is kept (their modules and source lines are dropped)."""
    import linecache

    import torch

    from puzzles import sim

    from ...backends.simulator import observe_file
    from ...specs import SPECS

    def step(dist):
        w = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
        (torch.randn(4, 8, dtype=torch.float64) @ w).relu().sum().backward()
        dist.all_reduce(w.grad)
        dist.barrier()
        return w.grad

    sim.run(step, 2)
    naive = REPO / "tests" / "naive"
    for spec in SPECS.values():
        if (naive / spec.filename).is_file():
            observe_file(spec, naive / spec.filename, spec.make_inputs(0), 0)
    for name in [n for n in sys.modules if n.startswith("_graded_")]:
        del sys.modules[name]
    linecache.clearcache()


def _plumb(record_w: int, output_w: int) -> int:
    """stdin from /dev/null, stdout and stderr to the warden's output pipe, the record pipe at an fd number chosen
    at random; every other descriptor closed (the socket to the parent above all)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output_w, 1)
    os.dup2(output_w, 2)
    record_fd = random.SystemRandom().randrange(100, 250)
    os.dup2(record_w, record_fd)
    os.closerange(3, record_fd)
    os.closerange(record_fd + 1, 4096)
    return record_fd


def observe(puzzle_id: str, folder: Path, seed: int) -> dict:
    """{"status": "observed", "observation": ...} or {"status": "not_attempted" | "error", "error": why}."""
    from ...backends.learner_code import describe_exception
    from ...backends.simulator import observe_file
    from ...core.result import ERROR, PuzzleResult
    from ...specs import SPECS

    spec = SPECS[puzzle_id]
    path = folder / spec.filename
    try:
        observed = observe_file(spec, path, spec.make_inputs(seed), seed)
    except SystemExit as exc:  # out of a rank: the simulator re-raises it here
        return {"status": ERROR, "error": f"the puzzle called sys.exit({exc.code!r}) instead of returning"}
    except BaseException as exc:  # KeyboardInterrupt, GeneratorExit, ... raised by the learner's code
        return {"status": ERROR, "error": describe_exception(exc, path)}
    if isinstance(observed, PuzzleResult):
        return {"status": observed.status, "error": observed.error}
    # The observation's fields as they are (record.py copies them into plain data; dataclasses.asdict would
    # deep-copy the learner's objects first, calling their __deepcopy__).
    return {"status": "observed", "observation": {f.name: getattr(observed, f.name)
                                                  for f in dataclasses.fields(observed)}}


def record_bytes(record: dict) -> bytes:
    return record_format.dumps(record)


def _finish(record_fd: int, data: bytes, _write=os.write, _exit=os._exit) -> None:
    """Write the record and exit at once: no atexit hook, no finalizer of the learner's runs after this. (The
    streams may be the learner's objects, flushed after the record's bytes are made: they cannot change them.)"""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001  (the learner may have replaced or closed them)
            pass
    view = memoryview(data)
    while view:
        view = view[_write(record_fd, view):]
    _exit(0)


def _threads(_listdir=os.listdir) -> list[str]:
    """A thread still running when the record is made (an honest run leaves none: the ranks' threads have ended)
    could change the record as it is made."""
    try:
        count = len(_listdir("/proc/self/task"))
    except OSError:  # no /proc (macOS): threading's own count
        count = threading.active_count()
    return [f"{count - 1} thread(s) of the answer's were still running when its record was made (they could "
            f"change it on its way out)"] if count > 1 else []


def run_puzzle(request: dict, policy, slot: int, jail: Path, record_w: int, output_w: int, pristine,
               _write=os.write, _exit=os._exit, _dumps=record_format.dumps, _observe=observe, _finish=_finish,
               _unhook=Fingerprint.unhook, _changes=Fingerprint.changes, _look=Fingerprint.__init__,
               _restore=ProcessState.restore, _no_gc=gc.disable, _threads=_threads) -> None:
    """Never returns. The record is written last, to a pipe only the warden reads, and the process exits.

    What it calls after the learner's code is bound in its defaults when the zygote defined it, and reaches its
    frame's locals when it is called (before any learner's code): rebinding a name of this module, or of the
    grader's, on the way changes nothing here."""
    record_fd = None
    try:
        record_fd = _plumb(record_w, output_w)
        if policy.mode != "process":
            sandbox.enter_root(jail)
            folder = Path(sandbox.SUBMISSION)
        else:
            folder = jail
        sandbox.drop_privileges(policy, slot)
        if sys.platform == "linux":
            sandbox.prctl(sandbox.PR_SET_PDEATHSIG, 9)  # after the uid change, which clears it
        os.environ.update(HOME="/tmp", TMPDIR=str(folder) if policy.mode == "process" else "/tmp")
        tempfile.tempdir = os.environ["TMPDIR"]  # (the zygote's own, cached by its mkdtemp, is not in the jail)
        os.chdir(folder)
        sys.dont_write_bytecode = True
        sandbox.set_limits(request["memory_mb"], request["timeout"], policy)
    except BaseException as exc:  # the jail could not be entered: nothing of the learner's has run
        print(f"the sandbox failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(70)
    _write(record_fd, JAILED)  # from here on, however this process ends is the learner's doing
    if request.get("probe"):  # can this uid read what a puzzle imports?
        import torch

        for module in (os, torch, sandbox):
            with open(module.__file__, "rb") as f:
                f.read(1)
        _finish(record_fd, b"ok")
    record = _observe(request["puzzle"], folder, request["seed"])
    # No learner's code runs from here on: no collection (a __del__ of the learner's would run), and first the
    # hooks go (a profile hook would see, and could rewrite, everything below). Then this second look compares with
    # the zygote's fingerprint from before any learner's code, after everything this process did (observe_file
    # fingerprints the grader around the learner's run itself: a "tampered" result).
    _no_gc()
    _unhook(pristine)
    later = object.__new__(Fingerprint)
    _look(later, with_kernels=True, force_kernels=True)  # (a kernel could come from a compiled library too)
    # (A thread left running matters where the record holds figures to grade: a rank abandoned in an endless loop
    # that catches every exception ends its run with an error, which says so.)
    findings = _changes(pristine, later) + (_threads() if record["status"] == "observed" else [])
    if findings:
        _restore(pristine.state)  # torch's modes and switches as they were, its kernels its own
    record["findings"] = findings
    try:
        data = _dumps(record)
    except (TypeError, ValueError, RecursionError) as exc:  # not plain data (a lambda, a lock, a cycle, ...)
        data = _dumps({"status": "error", "findings": findings,
                       "error": f"the answer returned data that cannot be recorded: {exc}"})
    _finish(record_fd, data)
