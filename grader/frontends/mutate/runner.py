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

import faulthandler
import json
import os
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...backends.simulator import observe_file
from ...core.grading import grade_observation, one_thread
from ...core.result import ERROR, FAIL, PASS, PuzzleResult
from .source import Mutant

KILLED, SURVIVED, EQUIVALENT, GRADER_ERROR, TOOL_ERROR = "killed", "survived", "equivalent", "grader-error", "tool-error"
TIME_FACTOR, MIN_SIM_TIMEOUT = 10, 2.0  # the simulator's limit: 10x the reference's run time, at least 2 s


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # KILLED, SURVIVED, EQUIVALENT, GRADER_ERROR or TOOL_ERROR
    killed_by: str = ""  # the checks that failed ("updated weights, all-reduce volume"), or "error: ..."
    detail: str = ""  # the grader's or the tool's error; for an equivalent, why it is one
    seconds: float = 0.0
    listed_equivalent: str = ""  # on the equivalents list, yet killed: the list's reason
    peak_bytes: list[int] = field(default_factory=list)  # per rank, when the mutant ran to the end
    makespan: int | None = None

    def to_dict(self) -> dict:
        d = {**self.mutant.key, "lineno": self.mutant.lineno, "description": self.mutant.description,
             "status": self.status, "killed_by": self.killed_by, "seconds": round(self.seconds, 3)}
        if self.detail:
            d["detail"] = self.detail
        if self.listed_equivalent:
            d["listed_equivalent"] = self.listed_equivalent
        if self.status != KILLED:
            d["diff"] = self.mutant.diff
            d["peak_bytes"], d["makespan_ticks"] = self.peak_bytes, self.makespan
        return d


@dataclass(frozen=True)
class Limits:
    sim_timeout: float  # seconds a rank may compute without communicating (the simulator's limit)
    wall: float  # seconds before the parent kills the child
    memory_mb: int  # address space a child may add to the parent's

    @classmethod
    def from_reference(cls, seconds: float, memory_mb: int = 4096) -> Limits:
        sim = max(MIN_SIM_TIMEOUT, TIME_FACTOR * seconds)
        return cls(round(sim, 2), round(3 * sim + 5, 2), memory_mb)


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
    with tempfile.TemporaryDirectory(prefix="grader-mutate-") as tmp:
        try:
            while waiting or running:
                while waiting and len(running) < max(1, jobs):
                    i = waiting.pop(0)
                    child = _start(spec, mutants[i], i, (inputs, reference), seed, limits, Path(tmp) / f"m{i}")
                    running[child.fd] = child
                soonest = min(c.deadline for c in running.values())
                ready, _, _ = select.select(list(running), [], [], max(0.0, soonest - time.monotonic()))
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


def _start(spec, mutant: Mutant, index: int, data: tuple, seed: int, limits: Limits, workdir: Path) -> _Child:
    workdir.mkdir()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.setpgid(0, 0)  # its own process group, so that whatever it starts is killed with it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler
        os.close(read_fd)
        _child_main(spec, mutant, data, seed, limits, workdir, write_fd)
    os.close(write_fd)
    now = time.monotonic()
    return _Child(index, pid, read_fd, now, now + limits.wall, workdir)


def _child_main(spec, mutant: Mutant, data: tuple, seed: int, limits: Limits, workdir: Path, fd: int):
    def send(kind: str, **payload):
        data = (json.dumps({"kind": kind, **payload}) + "\n").encode()
        while data:
            data = data[os.write(fd, data):]

    try:
        try:
            out = os.open(workdir / "output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)  # what the mutant prints stays out of the report
            os.dup2(out, 2)
            faulthandler.enable(file=2)  # a crash's traceback goes there too, not to the parent's stderr
            _limit_memory(limits.memory_mb)
            torch.set_num_threads(1)
            (torch.ones(64, 64) @ torch.ones(64, 64)).sum()  # a canary: a fork that broke torch hangs here, a tool error
            sys.dont_write_bytecode = True
            path = workdir / spec.filename
            path.write_text(mutant.source)
            inputs, reference = data
            spec.timeout = limits.sim_timeout  # this child's copy of the spec only
            spec.reference = lambda _inputs: reference  # computed by the parent on these very inputs
        except BaseException:
            send(TOOL_ERROR, detail=_last_lines(traceback.format_exc()))
            os._exit(0)
        send("observing")
        try:
            observed = observe_file(spec, path, inputs, seed)
        except BaseException as exc:  # observe_file reports the learner's Exceptions itself; this is the rest
            send("result", status=ERROR, error=f"{type(exc).__name__}: {exc}", checks=[])
            os._exit(0)
        send("grading")
        try:
            result = observed if isinstance(observed, PuzzleResult) else grade_observation(spec, observed, inputs)
        except BaseException:
            send(GRADER_ERROR, detail=_last_lines(traceback.format_exc()))
            os._exit(0)
        send("result", status=result.status, error=result.error, checks=[c.name for c in result.failed_checks()],
             peak=list(result.peak_bytes), makespan=result.makespan_ticks)
    except BaseException:  # the pipe itself failed: nothing more can be said
        pass
    os._exit(0)


def _kill(pid: int) -> None:
    """SIGKILL to the child's process group (it leads one) and to the child itself. The child is not reaped yet,
    so its pid, which is also the group's id, cannot have been reused."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _limit_memory(megabytes: int) -> None:
    """The child may grow its address space by `megabytes` beyond what it inherited (torch maps a lot)."""
    try:
        with open("/proc/self/status") as f:
            current = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return
    limit = current + megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


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
    output = _last_lines(_read(child.workdir / "output.txt"))
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


def _last_lines(text: str, n: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
