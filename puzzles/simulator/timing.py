"""Timing a rank's device: torch.cuda's Event(enable_timing=True), on the rank's simulated clock.

    from puzzles.sim import cuda                # on a GPU: from torch import cuda
    before = cuda.Event(enable_timing=True)
    after = cuda.Event(enable_timing=True)
    before.record()
    y = x @ w
    after.record()
    after.synchronize()
    ms = before.elapsed_time(after)             # milliseconds of the device's time between the two records

On a GPU an event recorded on a stream is stamped when the stream reaches it: after every kernel queued before
it, whenever the host queued them. Here the stamp is the rank's compute stream at the moment of record(): the
tick at which everything the rank has issued to it so far is done (an async collective not waited for is on the
communication queue, not on the stream, as on a GPU). So on a straggler (CostModel.slow_ranks) the same ops
measure k times as long, and the others measure their own time, not the time they spend waiting for it.

A tick is a nanosecond (cost.py): elapsed_time is (end - start) / TICKS_PER_MS, a float, as torch's.

Where it runs:
    a simulated rank                the rank's clock (with a host, host.py: record() is a launch, synchronize()
                                    makes the host wait for the device, a sync on its "host" track)
    a real process the grader runs  the tracker's clock (grader/backends/real/tracker.py): the same ops' ticks,
                                    a straggler's included, laid end to end (real processes on one CPU are not
                                    slowed; the cost model says who is)
    anywhere else                   torch.cuda.Event itself where CUDA is available, else time.perf_counter()
                                    read when the event is recorded (a CPU runs each op as it is called)
"""

from __future__ import annotations

import time

import torch

from .cost import TICKS_PER_MS


class Event:
    """torch.cuda.Event's timing: record(), synchronize(), query(), elapsed_time(end) in milliseconds."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._stamp: float | None = None  # ticks (a rank's clock) or seconds (perf_counter)
        self._unit = ""
        self._cuda = None

    def record(self, stream=None) -> None:
        from .guards import caller  # (here, not as this module's name: sim.cuda is this module)
        who = caller()
        if who is not None:
            clock, host = who.clock, getattr(who, "host", None)
            if host is not None:
                host.launch(clock)
            self._stamp, self._unit = clock.compute, "ticks"
        elif torch.cuda.is_available():
            self._cuda = self._cuda or torch.cuda.Event(enable_timing=self.enable_timing)
            self._cuda.record(stream)
            self._unit = "cuda"
        else:
            self._stamp, self._unit = time.perf_counter(), "seconds"

    def synchronize(self) -> None:
        """Wait until the device has reached the event (with a simulated host, the host waits: a sync)."""
        from .guards import caller  # (here, not as this module's name: sim.cuda is this module)
        who = caller()
        host = getattr(who, "host", None) if who is not None else None
        if host is not None:
            host.sync(who.clock, "Event.synchronize()", who.site())
        elif self._unit == "cuda":
            self._cuda.synchronize()

    def query(self) -> bool:
        return self._unit != "cuda" or self._cuda.query()

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event to `end`, both recorded, both with enable_timing=True (torch refuses
        otherwise, and so does this)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if not self._unit or not end._unit:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if self._unit != end._unit:
            raise RuntimeError("the two events were recorded on different clocks (one inside a rank, one outside)")
        if self._unit == "cuda":
            return self._cuda.elapsed_time(end._cuda)
        if self._unit == "ticks":
            return (end._stamp - self._stamp) / TICKS_PER_MS
        return (end._stamp - self._stamp) * 1_000.0


def synchronize(device=None) -> None:
    """torch.cuda.synchronize(): wait for the device's queue to empty (a sync, with a simulated host)."""
    from .guards import caller  # (here, not as this module's name: sim.cuda is this module)
    who = caller()
    host = getattr(who, "host", None) if who is not None else None
    if host is not None:
        host.sync(who.clock, "cuda.synchronize()", who.site())
    elif who is None and torch.cuda.is_available():
        torch.cuda.synchronize(device)

