"""Measurements a rank program takes while the learner's code runs (say, the bytes a rank holds between its
forward and its backward; the hooks its step left on the weights). On the simulator memory is read off the rank's
ledger; on real torch.distributed processes, off the tracker that the real-backend launcher installs."""

from __future__ import annotations

import os
import sys

import torch
from torch.autograd import Variable
from torch.utils._python_dispatch import _disable_current_modes

from puzzles import sim

_process_tracker = None  # a callable returning the bytes alive in this process, set by the real-backend launcher
_process_timeline = None  # a callable returning how many entries the process's ledger timeline has


def install_process_tracker(current_bytes, timeline_length=None) -> None:
    global _process_tracker, _process_timeline
    _process_tracker, _process_timeline = current_bytes, timeline_length


def memory_now() -> int:
    """Bytes alive on the calling rank right now."""
    ledger = sim.current_ledger()
    if ledger is not None:
        return ledger.current
    if _process_tracker is not None:
        return _process_tracker()
    raise RuntimeError("memory_now() needs a simulated rank or a tracked process")


def ledger_mark() -> int:
    """Where the calling rank's ledger timeline stands now (its length): the entries between two marks are the
    allocations and frees made in between, so a harness can read the peak of one call out of a run that makes
    several (Observation.ledgers[rank]["timeline"][start:end])."""
    ledger = sim.current_ledger()
    if ledger is not None:
        return len(ledger.timeline)
    if _process_timeline is not None:
        return _process_timeline()
    raise RuntimeError("ledger_mark() needs a simulated rank or a tracked process")


# ---- hooks left behind


class _HookFired(Exception):
    """Raised by the probe's trace at the first line of a hook, so that the hook does nothing."""


def _run_engine(loss) -> None:
    # The autograd engine called directly (torch.autograd.backward's Python wrapper runs logging code of its own):
    # any Python frame whose caller is this one was entered from the engine, and so is a hook.
    Variable._execution_engine.run_backward((loss,), (torch.ones_like(loss),), False, False, (), True, True)


def hooks_that_fire(tensors) -> list[str]:
    """The hooks that a backward through each of `tensors` would still call: one backward of tensor.sum() each,
    after the learner's step, stopping every hook before its first line (so that it communicates nothing). Sees
    every kind: tensor hooks, post-accumulate-grad hooks, and hooks on a kept AccumulateGrad node, which nothing
    on the tensor shows. Runs with the dispatch modes off (the ledger, the clock: this is the grader's work, not
    the rank's), and leaves each tensor's .grad None. Returns one 'name (file:line)' per tensor whose hook fired."""
    fired = []

    def trace(frame, event, arg):
        if event == "call" and frame.f_back is not None and frame.f_back.f_code is _run_engine.__code__:
            code = frame.f_code
            fired.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})")
            raise _HookFired
        return None

    with _disable_current_modes():
        for t in tensors:
            if not isinstance(t, torch.Tensor) or not t.requires_grad or t.grad_fn is not None:
                continue
            t.grad = None
            loss = t.sum()
            before = sys.gettrace()
            sys.settrace(trace)
            try:
                _run_engine(loss)
            except _HookFired:
                pass
            finally:
                sys.settrace(before)
            t.grad = None
    return fired
