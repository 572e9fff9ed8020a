"""The simulated clock: a compute stream and a communication queue per rank, in whole ticks.

Every rank has them, as a GPU does:

    compute  |==fwd==|==fwd==|====bwd====|      |==update==|
    comm     |       |       |==all_reduce (async)==|
                                                   ^ wait() joins the two

Every op a rank runs is laid on its compute stream, one after the other, at its roofline cost (cost.py; what
each op costs is in op_costs.py). Consecutive ops of the same phase, label and line of the learner's code merge
into one event, so a chart shows "forward F3 at line 42" rather than forty kernels.

Communication runs in the order each rank issued it, as NCCL runs a rank's operations on its stream:

    - a send starts after every send the rank issued before it, a receive after every earlier receive (links are
      full duplex: a rank sends to its right and receives from its left at once, as the ring algorithm does);
    - a collective starts after everything the rank issued before it, and everything after waits for it;
    - a transfer starts when both ends have issued it, a collective when its last participant has.

An op is placed on the clock once it is matched and every op issued before it on each of its ranks has been
placed, so the order in which the simulator happens to match calls never changes a time. `wait()` returns once
its op is placed, and moves the compute stream to the op's end: that is how overlap shows as a shorter makespan.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch

# The cost model lives in cost.py and op_costs.py; these names are the clock's public face.
from .cost import PUZZLE_GPU, CostModel, DeviceProfile  # noqa: F401
from .op_costs import FREE, PRODUCTS, OpCost, op_cost  # noqa: F401


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


def op_dtype(out) -> torch.dtype | None:
    """The dtype an op computed in (its first output's), for the half-precision rate of the cost model."""
    first = out[0] if isinstance(out, (list, tuple)) and out else out
    return first.dtype if isinstance(first, torch.Tensor) else None


@dataclass
class Event:
    """One interval on one stream of one rank.

    stream: "compute" or "comm".
    kind:   for compute, "forward" or "backward" (autograd was running it); for comm, the op ("all_reduce", "send", ...).
    label:  the innermost `torch.profiler.record_function(...)` name active when it ran ("" if none), so a
            learner can name microbatches ("F3", "B3") or phases ("recompute") and see them on the chart.
    phase:  for comm ops, "forward" or "backward" (issued inside autograd's backward or not).
    flops, bytes: for compute, the FLOPs and the bytes read and written of its ops (op_costs.py);
    product_flops: the FLOPs of those ops that are products (matmuls, attention), the rest being elementwise
            ops, reductions and copies.
    nbytes: for comm ops, the size of the buffer (the full buffer for all_gather/reduce_scatter);
    wire_bytes: what each rank sends under the ring algorithm.
    peers:  the global ranks of the group, or (src, dst) for point-to-point.
    site:   the learner's line that issued the op (for compute: the line its first op came from).
    ops:    how many aten ops the event holds; op: what they were ("mm x4, gelu x2").
    issued: for comm ops, the compute stream's tick when the rank issued it (it may start later).
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
    bytes: int = 0
    op: str = ""
    issued: int = 0
    product_flops: int = 0

    @property
    def ticks(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def describe_ops(counts: dict[str, int]) -> str:
    """'mm x4, gelu x2, add x2': the ops of a merged compute event, most frequent first."""
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def charge_compute(clock: RankClock, rank: int, cost_model: CostModel, cost: OpCost, func, out, labels: list,
                   site) -> int:
    """Lay one op of a rank's own code on its compute stream; return the FLOPs it counts. The harness's own ops
    (the grader's lines around the learner's: zeroing gradients, keeping results) cost nothing: they are not the
    answer's work. A backward the harness starts runs through the answer's graph, so it is charged."""
    ticks = slowed(cost_model, rank, cost_model.compute_ticks(cost, op_dtype(out)))
    return charge_op(clock, rank, ticks, cost, func.overloadpacket.__name__, labels, site(), phase())


def slowed(cost_model: CostModel, rank: int, ticks: int) -> int:
    """An op's ticks on this rank's device: k times as long on a straggler (Part IV, cost.py's slow_ranks)."""
    if getattr(cost_model, "slow_ranks", ()):
        return math.ceil(ticks * cost_model.slowdown(rank))
    return ticks


def charge_op(clock: RankClock, rank: int, ticks: int, cost: OpCost, name: str, labels: list, where: str,
              kind: str) -> int:
    """charge_compute, for a caller that has found the op's ticks (slowed for this rank), name, line and phase
    already (the simulator's dispatch mode finds each once per op, and keeps the ticks of each cost it meets)."""
    if kind == "forward" and where.startswith("[harness]"):
        return 0
    clock.run_compute(rank, ticks, cost, kind, labels[-1] if labels else "", name, where)
    return cost.flops


@dataclass
class Queued:
    """One rank's part in one communication op, from the moment it was issued until the op is on the clock.

    `op` is set when the op is matched (the data has moved): the entries of every rank taking part, the ticks it
    takes, and the lanes it uses. `event` holds what the rank's Event will say."""

    rank: int
    issued: int
    work: object
    event: dict
    lanes: tuple[str, ...]  # ("send",), ("recv",) or ("send", "recv") for a collective
    op: QueuedOp | None = None


@dataclass
class QueuedOp:
    entries: list[Queued]
    ticks: int


@dataclass
class RankClock:
    """The compute stream and the communication queue of one rank.

    compute: the tick at which the compute stream is next free.
    comm:    the tick at which the last communication op placed on this rank ends.
    lanes:   for each direction ("send", "recv"), the ops issued but not placed yet, in issue order, and the tick
             at which the lane is next free.
    """

    compute: int = 0
    comm: int = 0
    events: list = field(default_factory=list)
    pending: dict = field(default_factory=lambda: {"send": deque(), "recv": deque()})
    free: dict = field(default_factory=lambda: {"send": 0, "recv": 0})
    _last_compute: Event | None = field(default=None, repr=False)
    _last_ops: dict = field(default_factory=dict, repr=False)

    def run_compute(self, rank: int, ticks: int, cost: OpCost, kind: str, label: str, name: str,
                    site: str = "") -> None:
        """Advance the compute stream by one op (`name`, from the learner's line `site`). It joins the previous
        event if that one ends where it starts and has the same kind, label and site."""
        start = self.compute
        self.compute = start + ticks
        last = self._last_compute
        if last is not None and last.end == start and last.kind == kind and last.label == label and last.site == site:
            last.end = self.compute
            last.flops += cost.flops
            last.bytes += cost.bytes
            last.product_flops += cost.flops if cost.kind in PRODUCTS else 0
            last.ops += 1
            self._last_ops[name] = self._last_ops.get(name, 0) + 1
            return
        self.close()
        ev = Event(rank, "compute", kind, start, self.compute, flops=cost.flops, bytes=cost.bytes, label=label,
                   site=site, op=name, product_flops=cost.flops if cost.kind in PRODUCTS else 0)
        self.events.append(ev)
        self._last_compute = ev
        self._last_ops = {name: 1}

    def close(self) -> None:
        """Write the last compute event's op names ("mm x4, gelu x2"): once, when no op can join it any more."""
        if self._last_compute is not None and self._last_compute.ops > 1:
            self._last_compute.op = describe_ops(self._last_ops)

    # ---- the communication queue

    def issue(self, entry: Queued) -> None:
        for lane in entry.lanes:
            self.pending[lane].append(entry)

    def at_head(self, entry: Queued) -> bool:
        pending = self.pending
        for lane in entry.lanes:
            queue = pending[lane]
            if not queue or queue[0] is not entry:
                return False
        return True

    def blocking(self, entry: Queued) -> Queued | None:
        """The op issued before `entry` on one of its lanes that has not been placed yet (what holds it back)."""
        for lane in entry.lanes:
            if self.pending[lane] and self.pending[lane][0] is not entry:
                return self.pending[lane][0]
        return None


def place_out_of_order(clocks: list[RankClock], op: QueuedOp) -> None:
    """Place a matched op now, ahead of ops its ranks issued before it that are not matched yet, because a rank
    waits for it and nothing else can move: the earlier op waits, directly or not, for this one to complete.
    gloo runs such a program; on NCCL, whose streams run each rank's operations in issue order, it would hang
    (the caller says so in the run's warnings)."""
    start = max(max(e.issued, *(clocks[e.rank].free[lane] for lane in e.lanes)) for e in op.entries)
    _place(clocks, op, start)


def _place(clocks: list[RankClock], op: QueuedOp, start: int) -> None:
    end = start + op.ticks
    for e in op.entries:
        c = clocks[e.rank]
        pending, free = c.pending, c.free
        for lane in e.lanes:
            queue = pending[lane]
            if queue[0] is e:  # (place_ready places only heads: the common case, without a search)
                queue.popleft()
            else:
                queue.remove(e)
            free[lane] = end
        if end > c.comm:
            c.comm = end
        c.events.append(Event(e.rank, "comm", start=start, end=end, issued=e.issued, **e.event))
        e.work._start = start  # Part IV: the flight recorder's time_started
        e.work._finish(end)
    for e in op.entries:  # placed: drop the links between the entries and their op (a reference cycle)
        e.op = e.work = None


def place_ready(clocks: list[RankClock], from_ranks) -> None:
    """Place on the clock every matched op whose entries are each first in their rank's lanes, and whatever that
    frees, until nothing more can be placed. An op starts when every rank has issued it and its lanes are free
    on every rank; it ends `ticks` later on all of them."""
    todo = deque(dict.fromkeys(from_ranks))
    while todo:
        rank = todo.popleft()
        pending = clocks[rank].pending
        for lane in _LANES:
            queue = pending[lane]
            if not queue:
                continue
            op = queue[0].op
            if op is None:
                continue
            entries = op.entries
            start = 0
            for e in entries:  # (each entry first in its rank's lanes; the op starts when all are issued and free)
                c = clocks[e.rank]
                if not c.at_head(e):
                    break
                free = c.free
                start = max(start, e.issued, *[free[other] for other in e.lanes])
            else:
                todo.extend([e.rank for e in entries])
                _place(clocks, op, start)
                todo.append(rank)
                break


_LANES = ("send", "recv")
