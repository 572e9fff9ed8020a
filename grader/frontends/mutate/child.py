"""The forked child's side: grade one mutant and report each step through a pipe (see runner.py for what each
step means). Everything here runs in the child, which ends with os._exit and never returns."""

from __future__ import annotations

import faulthandler
import json
import os
import resource
import sys
import traceback
from pathlib import Path

import torch

from ...backends.simulator import observe_file
from ...core.grading import grade_observation
from ...core.result import ERROR, PuzzleResult
from ...core.result import GRADER_ERROR as GRADER_ERROR_STATUS
from .outcome import GRADER_ERROR, TOOL_ERROR, Limits
from .source import Mutant


def main(spec, mutant: Mutant, data: tuple, seed: int, limits: Limits, workdir: Path, fd: int):
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
            send(TOOL_ERROR, detail=last_lines(traceback.format_exc()))
            os._exit(0)
        send("observing")
        try:  # (a mutant is the reference with one mistake of ours in it: no fingerprint is taken around it)
            observed = observe_file(spec, path, inputs, seed, _fingerprint=_NoLook, _untampered=_as_observed)
        except BaseException as exc:  # observe_file reports the learner's Exceptions itself; this is the rest
            send("result", status=ERROR, error=f"{type(exc).__name__}: {exc}", checks=[])
            os._exit(0)
        send("grading")
        try:
            result = observed if isinstance(observed, PuzzleResult) else grade_observation(spec, observed, inputs)
        except BaseException:
            send(GRADER_ERROR, detail=last_lines(traceback.format_exc()))
            os._exit(0)
        if result.status == GRADER_ERROR_STATUS:  # the checks crashed: core.grading said so in the result
            send(GRADER_ERROR, detail=result.error)
            os._exit(0)
        send("result", status=result.status, error=result.error, checks=[c.name for c in result.failed_checks()],
             peak=list(result.peak_bytes), makespan=result.makespan_ticks)
    except BaseException:  # the pipe itself failed: nothing more can be said
        pass
    os._exit(0)


class _NoLook:
    """In place of the tamper fingerprint (backends/tamper.py), which asks whether an answer changed the grader: a
    mutant is the reference with one of the operators' mistakes in it, none of which reaches the grader, so the
    two looks around its run (a fifth of grading it) would only ever find nothing."""

    def unhook(self) -> None:
        pass


def _as_observed(spec, before, outcome):
    return outcome


def _limit_memory(megabytes: int) -> None:
    """The child may grow its address space by `megabytes` beyond what it inherited (torch maps a lot)."""
    try:
        with open("/proc/self/status") as f:
            current = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return
    limit = current + megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def last_lines(text: str, n: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-n:])
