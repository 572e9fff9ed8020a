"""The simulated clock: what a compute op or a message costs, in whole ticks.

Every rank has two streams, as a GPU does:

    compute  |==fwd==|==fwd==|====bwd====|      |==update==|
    comm     |       |       |==all_reduce (async)==|
                                                   ^ wait() joins the streams

A compute op costs its FLOPs over a FLOP rate. A message costs a latency plus its bytes over a bandwidth, and
a collective costs what the ring algorithm that NCCL and gloo use would cost. Times are integers (ticks), so
19.9 never prints as 19.90000000000001 and the timeline is the same on every run and every machine.

Think of a tick as a nanosecond: the defaults below are then a 1 TFLOP/s device, 1 µs per message and 10 GB/s
links. A puzzle sets its own `CostModel` and prints it in its text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import torch
from torch.utils.flop_counter import flop_registry


@dataclass(frozen=True)
class CostModel:
    """The constants of the simulated machine.

    flops_per_tick: how many floating-point operations a rank computes in one tick.
    latency_ticks:  the fixed cost of one message (alpha), paid once per ring step of a collective.
    bytes_per_tick: the bandwidth of one link (1/beta).
    half_precision_speedup: how many times faster an op computes in float16 or bfloat16 than in float32/64.
                    1 by default: half precision is then no faster, only smaller (it halves the bytes the ledger
                    and the links see). A GPU's tensor cores make it several times faster; a puzzle that wants
                    that on the clock says so in its cost model.

    Formulas, for a buffer of n bytes and a group of N ranks (alpha = latency, beta = 1/bandwidth):

        send/recv       alpha + n*beta
        all_reduce      2(N-1)*alpha + 2(N-1)/N * n*beta     (reduce-scatter then all-gather)
        all_gather      (N-1)*alpha + (N-1)/N * n*beta       n = the gathered (full) buffer
        reduce_scatter  (N-1)*alpha + (N-1)/N * n*beta       n = the input (full) buffer
        broadcast       (N-1)*alpha + n*beta                 (pipelined along the ring)
        barrier         2(N-1)*alpha                         (an all_reduce of nothing)
        all_to_all      (N-1)*alpha + n*beta                 n = the most bytes any rank sends or receives
                                                             from the others (pairwise exchanges, N-1 steps)

    A group of one rank communicates with nobody and costs nothing. Bandwidth terms are rounded up to a whole tick;
    `bytes_per_tick=None` makes them zero (free messages, for exact textbook figures such as a pipeline's bubble).
    """

    flops_per_tick: int = 1000
    latency_ticks: int = 1000
    bytes_per_tick: int | None = 10  # None: infinite bandwidth, a message costs its latency only
    half_precision_speedup: int = 1

    def __post_init__(self):
        if self.flops_per_tick <= 0 or self.latency_ticks < 0 or self.half_precision_speedup < 1 or (
                self.bytes_per_tick is not None and self.bytes_per_tick <= 0):
            raise ValueError(f"CostModel needs positive rates and a non-negative latency, got {self}")

    def compute_ticks(self, flops: int, dtype: torch.dtype | None = None) -> int:
        rate = self.flops_per_tick
        if dtype in (torch.float16, torch.bfloat16):
            rate *= self.half_precision_speedup
        return -(-flops // rate)

    def comm_ticks(self, kind: str, nbytes: int, group_size: int) -> int:
        """Ticks that one communication op occupies the comm stream of every rank taking part."""
        n, a = group_size, self.latency_ticks
        if kind in ("send", "recv"):
            return a + self._wire(nbytes)
        if n <= 1:
            return 0
        if kind == "all_reduce":
            return 2 * (n - 1) * a + self._wire(Fraction(2 * (n - 1) * nbytes, n))
        if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
            return (n - 1) * a + self._wire(Fraction((n - 1) * nbytes, n))
        if kind == "broadcast":
            return (n - 1) * a + self._wire(nbytes)
        if kind == "barrier":
            return 2 * (n - 1) * a
        if kind in ("all_to_all_single", "all_to_all"):
            return (n - 1) * a + self._wire(nbytes)
        if kind == "new_group":
            return 0
        raise ValueError(f"no cost formula for {kind!r}")

    def wire_bytes(self, kind: str, nbytes: int, group_size: int) -> int:
        """Bytes each rank sends under the ring algorithm (the 'communication volume' of the ZeRO paper)."""
        n = group_size
        if kind in ("send", "recv", "broadcast", "all_to_all_single", "all_to_all"):
            return nbytes  # an all-to-all's caller passes what this rank sends to the others
        if n <= 1:
            return 0
        if kind == "all_reduce":
            return _ceil(Fraction(2 * (n - 1) * nbytes, n))
        if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
            return _ceil(Fraction((n - 1) * nbytes, n))
        return 0

    def _wire(self, nbytes) -> int:
        if self.bytes_per_tick is None:
            return 0
        return _ceil(Fraction(nbytes) / self.bytes_per_tick)


def _ceil(x: Fraction) -> int:
    return math.ceil(x)


def record_function_ops() -> tuple[set, set]:
    """The aten-level ops that `torch.profiler.record_function` enters and exits with, so that a dispatch mode can
    keep the stack of labels ("F3", "recompute") that events carry."""
    enter, exit_ = set(), set()
    prof = getattr(torch.ops, "profiler", None)
    for name, bucket in (("_record_function_enter_new", enter), ("_record_function_enter", enter),
                         ("_record_function_exit", exit_)):
        try:
            packet = getattr(prof, name)
            bucket.update(getattr(packet, o) for o in packet.overloads())
        except Exception:  # an older or newer torch without that op
            pass
    return enter, exit_


_RECORD_ENTER, _RECORD_EXIT = record_function_ops()


def follow_labels(func, args, labels: list) -> bool:
    """Keep `labels`, the stack of active record_function names, up to date; True if `func` was one of its ops."""
    if func in _RECORD_ENTER:
        labels.append(str(args[0]))
        return True
    if func in _RECORD_EXIT:
        if labels:
            labels.pop()
        return True
    return False


def phase() -> str:
    """'backward' while autograd's engine is running this thread's backward pass, else 'forward'."""
    return "backward" if torch._C._current_autograd_node() is not None else "forward"


_FORMULAS: dict = {}


def op_dtype(out) -> torch.dtype | None:
    """The dtype an op computed in (its first output's), for the half-precision rate of the cost model."""
    first = out[0] if isinstance(out, (list, tuple)) and out else out
    return first.dtype if isinstance(first, torch.Tensor) else None


def op_flops(func, args, kwargs, out) -> int:
    """FLOPs of one aten op, by the formulas `torch.utils.flop_counter` registers (matmuls, convolutions,
    attention). Every other op (elementwise, reductions, copies) counts zero, as in PyTorch's FlopCounterMode."""
    entry = _FORMULAS.get(func)
    if entry is None:
        formula = flop_registry.get(func.overloadpacket)
        # Most formulas are wrapped to turn tensors into shapes with pytree, which is slow: unwrap and do it here.
        entry = _FORMULAS[func] = (getattr(formula, "__wrapped__", None), formula)
    on_shapes, raw = entry
    if on_shapes is not None:
        return int(on_shapes(*map(_shape, args), out_shape=_shape(out), **{k: _shape(v) for k, v in kwargs.items()}))
    return int(raw(*args, **kwargs, out_val=out)) if raw is not None else 0


def _shape(x):
    if isinstance(x, torch.Tensor):
        return x.shape
    if isinstance(x, (list, tuple)):
        return type(x)(_shape(v) for v in x)
    return x


@dataclass
class Event:
    """One interval on one stream of one rank.

    stream: "compute" or "comm".
    kind:   for compute, "forward" or "backward" (autograd was running it); for comm, the op ("all_reduce", "send", ...).
    label:  the innermost `torch.profiler.record_function(...)` name active when it ran ("" if none), so a
            learner can name microbatches ("F3", "B3") or phases ("recompute") and see them on the chart.
    phase:  for comm ops, "forward" or "backward" (issued inside autograd's backward or not).
    nbytes: for comm ops, the size of the buffer (the full buffer for all_gather/reduce_scatter);
    wire_bytes: what each rank sends under the ring algorithm.
    peers:  the global ranks of the group, or (src, dst) for point-to-point.
    site:   the learner's line that issued a comm op.
    """

    rank: int
    stream: str
    kind: str
    start: int
    end: int
    flops: int = 0
    nbytes: int = 0
    wire_bytes: int = 0
    label: str = ""
    phase: str = ""
    peers: tuple = ()
    site: str = ""
    ops: int = 1

    @property
    def ticks(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class RankClock:
    """The two streams of one rank: the tick at which each is next free."""

    compute: int = 0
    comm: int = 0
    events: list = field(default_factory=list)
    _last_compute: Event | None = field(default=None, repr=False)

    def run_compute(self, rank: int, ticks: int, flops: int, kind: str, label: str) -> None:
        """Advance the compute stream by one op; consecutive ops of the same kind and label merge into one event."""
        start = self.compute
        self.compute = start + ticks
        last = self._last_compute
        if last is not None and last.end == start and last.kind == kind and last.label == label:
            last.end = self.compute
            last.flops += flops
            last.ops += 1
            return
        ev = Event(rank, "compute", kind, start, self.compute, flops=flops, label=label)
        self.events.append(ev)
        self._last_compute = ev
