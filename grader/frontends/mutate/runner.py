"""Grading mutants, each in a child process forked from this one, and saying what each outcome means.

A mutant can deadlock, loop forever, exhaust memory or kill its process, so none runs in the process that keeps
the tally. The parent has imported torch and the grader and graded the reference (so every cache is warm, and
torch runs one intra-op thread: forking after OpenMP has started its threads can hang the child); each child is a
fork of it that grades one mutant and reports back through a pipe, in three steps:

    observing   the mutant runs on the simulator (the learner's code and the simulator's)
    grading     the spec's checks read what it did (the grader's code)
    result      the verdict

What the last step reached decides whose fault an ending is. An exception or a death while observing is the
mutant's (killed, "error: ..."); one while grading is the grader's (a grader error: a wrong answer must never
crash the checks); anything before observing is this tool's (a tool error). Neither of the last two counts as a
kill. Limits: the simulator's own time limit (a multiple of the reference's run time, far below the default
minute), an address-space limit, and a wall-clock limit after which the parent kills the child.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...core.grading import one_thread
from ...core.result import ERROR, FAIL, PASS
from .child import last_lines
from .child import main as child_main
from .outcome import GRADER_ERROR, KILLED, SURVIVED, TOOL_ERROR, Limits, Outcome
from .source import Mutant

@dataclass
class _Child:
    index: int
    pid: int
    fd: int
    started: float
    deadline: float
    workdir: Path
    data: bytearray = field(default_factory=bytearray)


def grade_mutants(spec, mutants: list[Mutant], seed: int, limits: Limits, jobs: int = 2,
                  on_done=None) -> list[Outcome]:
    """Grade every mutant, `jobs` children at a time; outcomes in the mutants' order. The inputs for `seed` and
    the serial reference on them are computed once, here, and inherited by every child (the reference is a fifth
    to a half of grading one answer)."""
    inputs = spec.make_inputs(seed)
    with one_thread():
        reference = spec.reference(inputs)
    outcomes: list[Outcome | None] = [None] * len(mutants)
    waiting, running = list(range(len(mutants))), {}
    with tempfile.TemporaryDirectory(prefix="grader-mutate-") as tmp, _Stop() as stop:
        try:
            while waiting or running:
                stop.check()
                while waiting and len(running) < max(1, jobs):
                    i = waiting.pop(0)
                    child = _start(spec, mutants[i], i, (inputs, reference), seed, limits, Path(tmp) / f"m{i}")
                    running[child.fd] = child
                soonest = min(c.deadline for c in running.values())
                ready, _, _ = select.select([*running, stop.fd], [], [], max(0.0, soonest - time.monotonic()))
                stop.check()
                for fd in ready:
                    chunk = os.read(fd, 1 << 16)
                    if chunk:
                        running[fd].data += chunk
                        continue
                    child = running.pop(fd)
                    outcomes[child.index] = _finish(child, mutants[child.index], limits, killed=False)
                    if on_done:
                        on_done(outcomes[child.index])
                for fd, child in list(running.items()):
                    if time.monotonic() > child.deadline:
                        _kill(child.pid)
                        running.pop(fd)
                        outcomes[child.index] = _finish(child, mutants[child.index], limits, killed=True)
                        if on_done:
                            on_done(outcomes[child.index])
        finally:
            for child in running.values():  # interrupted: leave no child behind
                _kill(child.pid)
                os.waitpid(child.pid, 0)
                os.close(child.fd)
    return outcomes


class _Stop:
    """SIGTERM (`timeout 30 ...`) and SIGINT (Ctrl-C) while children run: noted by the handler, acted on by the loop
    (KeyboardInterrupt, and the children are killed on the way out). The handler itself does not raise: a signal
    that lands inside os.fork's at-fork hooks (logging has some) would have its exception swallowed there."""

    def __init__(self):
        self.signum = None
        self.fd, self._wake = os.pipe()  # the handler writes a byte, so that select() returns at once
        os.set_blocking(self._wake, False)
        self._saved = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._saved[s] = signal.signal(s, self._note)
        return self

    def _note(self, signum, frame):
        self.signum = signum
        try:
            os.write(self._wake, b"!")
        except OSError:  # the pipe is full: select() returns anyway
            pass

    def check(self):
        if self.signum is not None:
            raise KeyboardInterrupt(f"stopped by signal {self.signum}")

    def __exit__(self, *exc):
        for s, handler in self._saved.items():
            signal.signal(s, handler)
        os.close(self.fd)
        os.close(self._wake)


def _start(spec, mutant: Mutant, index: int, data: tuple, seed: int, limits: Limits, workdir: Path) -> _Child:
    workdir.mkdir()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns, never runs the parent's loop
        try:
            os.setpgid(0, 0)  # its own process group, so that whatever it starts is killed with it
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handlers (see _Stop)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.close(read_fd)
            child_main(spec, mutant, data, seed, limits, workdir, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    now = time.monotonic()
    return _Child(index, pid, read_fd, now, now + limits.wall, workdir)


def _kill(pid: int) -> None:
    """SIGKILL to the child's process group (it leads one) and to the child itself. The child is not reaped yet,
    so its pid, which is also the group's id, cannot have been reused."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _finish(child: _Child, mutant: Mutant, limits: Limits, killed: bool) -> Outcome:
    """The outcome, from what the child said before it ended, and how it ended."""
    _kill(child.pid)  # done or not: it, and anything it started that may hold the pipe open
    _, status = os.waitpid(child.pid, 0)
    os.set_blocking(child.fd, False)
    try:
        while chunk := os.read(child.fd, 1 << 16):
            child.data += chunk
    except OSError:  # nothing more to read now
        pass
    os.close(child.fd)
    seconds = time.monotonic() - child.started
    messages = _messages(child.data)
    kinds = [m["kind"] for m in messages]
    last = messages[-1] if messages else {}
    if "result" in kinds:
        return _verdict(mutant, last, seconds)
    if last.get("kind") in (GRADER_ERROR, TOOL_ERROR):
        return Outcome(mutant, last["kind"], detail=last.get("detail", ""), seconds=seconds)
    if killed:
        how = f"no result after {limits.wall:g} s (the simulator's limit of {limits.sim_timeout:g} s did not stop it)"
    elif os.WIFSIGNALED(status):
        how = f"the process died of {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        how = f"the process exited with status {os.WEXITSTATUS(status)}"
    output = last_lines(_read(child.workdir / "output.txt"))
    if kinds and kinds[-1] == "observing":
        return Outcome(mutant, KILLED, killed_by=f"error: {how} while the mutant ran", detail=output, seconds=seconds)
    if kinds and kinds[-1] == "grading":
        return Outcome(mutant, GRADER_ERROR, detail=f"{how} while the checks ran\n{output}", seconds=seconds)
    return Outcome(mutant, TOOL_ERROR, detail=f"{how} before the mutant ran\n{output}", seconds=seconds)


def _messages(data: bytes) -> list[dict]:
    """The child's messages, one JSON object a line; a line cut short by a kill is no message."""
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and "kind" in message:
            out.append(message)
    return out


def _verdict(mutant: Mutant, result: dict, seconds: float) -> Outcome:
    if result["status"] == PASS:
        return Outcome(mutant, SURVIVED, seconds=seconds, peak_bytes=result["peak"], makespan=result["makespan"])
    if result["status"] == FAIL:
        return Outcome(mutant, KILLED, killed_by=", ".join(result["checks"]), seconds=seconds)
    first = (result.get("error") or "").strip().splitlines()
    what = first[0] if first else result["status"]
    prefix = "error" if result["status"] == ERROR else result["status"].replace("_", " ")
    return Outcome(mutant, KILLED, killed_by=f"{prefix}: {_short(what)}", detail=result.get("error", ""),
                   seconds=seconds)


def _short(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
