"""What communication under compute costs the compute: the SMs a collective's kernels take.

NCCL runs a collective as kernels on some of the GPU's SMs; the products issued under it (Megatron's weight
gradient under the tensor-parallel all-reduce, FSDP's blocks under the next all-gather) get the rest. Calculon
charges this as each link's `processor_usage` (systems/a100_80g.json and h100_80g_nvl8.json at caa4b11): 0.15 of
the GPU for a collective on NVLink, 0.02 on the network between nodes. Here: while a collective issued
asynchronously is running, the rank's compute stream runs at (1 - u) of its speed:

    an op of w ticks, started with r ticks of collective still to run:
        w / (1 - u)            when that fits in r (the op ends before the collective does)
        w + u·r                otherwise (slowed for r ticks, then at full speed)

The collectives a rank has in flight run one after another (one NCCL stream), so each one's window opens when
the one before it closes; a collective is taken to start when issued if nothing is before it (the tensor-parallel
ones in a layer's backward, after the previous has been waited for). Waiting for a collective closes its window
and every window before it. Without overlap nothing is in flight, and nothing is charged.

`Windows` keeps each rank thread's windows (simulated ranks are threads) and the ticks the sharing added, which
the report shows as the class "shared SMs" of the rank it tallies.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from fractions import Fraction


class Windows:
    """Per rank thread: the collectives in flight, as [ticks still to run, u], oldest first."""

    def __init__(self):
        self._local = threading.local()

    def _state(self):
        if not hasattr(self._local, "open"):
            self._local.open, self._local.extra, self._local.next = deque(), 0, 0
        return self._local

    def open(self, ticks: int, usage) -> int:
        """A collective of `ticks` issued now; returns the token that closes it."""
        state = self._state()
        state.next += 1
        if ticks > 0 and usage:
            state.open.append([Fraction(ticks), Fraction(usage), state.next])
        return state.next

    def close(self, token: int) -> None:
        """The collective of `token` was waited for: it and every one before it have ended."""
        state = self._state()
        while state.open and state.open[0][2] <= token:
            state.open.popleft()

    def charge(self, ticks: int) -> int:
        """The ticks an op of `ticks` takes with the collectives in flight, and their windows advanced."""
        state = self._state()
        if not state.open or ticks == 0:
            return ticks
        work, elapsed = Fraction(ticks), Fraction(0)
        while work > 0 and state.open:
            window = state.open[0]
            remaining, usage = window[0], window[1]
            need = work / (1 - usage)
            if need <= remaining:
                elapsed += need
                window[0] -= need
                work = Fraction(0)
            else:
                elapsed += remaining
                work -= remaining * (1 - usage)
                state.open.popleft()
        total = math.ceil(elapsed + work)
        state.extra += total - ticks
        return total

    def extra(self) -> int:
        """The ticks the sharing has added on the calling rank's thread."""
        return self._state().extra


class InFlight:
    """A collective's work handle whose wait() also closes its window."""

    def __init__(self, handle, windows: Windows, token: int):
        self.handle, self.windows, self.token = handle, windows, token

    def wait(self):
        self.handle.wait()
        self.windows.close(self.token)
