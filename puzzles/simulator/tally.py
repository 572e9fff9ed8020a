"""What a piece of code costs on the simulated GPU, outside any run: its FLOPs, bytes and ticks, by class of op.

    with sim.tally() as t:
        y = forward(x, layers)
    print(t)            # 12 ops, 1,069,056 FLOPs, 1,060 ticks: matmul 1,040 ticks, elementwise 20, ...

It charges every op exactly as a simulated rank's compute stream does (the same op_costs.py and cost model), on
one device, with no communication and no memory ledger. The grader derives the puzzles' compute and time budgets
with it, from the serial model's own ops, so a budget's F (one stage's forward of one microbatch, say) is what
those ops cost on this clock; a learner can use it to see where the time of a forward goes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch.utils._python_dispatch import TorchDispatchMode

from .clock import follow_labels, op_dtype, phase
from .cost import CostModel
from .op_costs import DECOMPOSE, FREE, OP_CLASSES, op_cost, rule_for


@dataclass
class Tally:
    """The cost of the ops seen: totals, and ticks, FLOPs and op counts by class ("matmul", "elementwise", ...)
    and by phase ("forward", "backward")."""

    cost: CostModel = field(default_factory=CostModel)
    ops: int = 0
    flops: int = 0
    bytes: int = 0
    ticks: int = 0
    ticks_by_class: Counter = field(default_factory=Counter)
    flops_by_class: Counter = field(default_factory=Counter)
    ops_by_class: Counter = field(default_factory=Counter)
    ticks_by_phase: Counter = field(default_factory=Counter)
    flops_by_phase: Counter = field(default_factory=Counter)
    ops_by_name: Counter = field(default_factory=Counter)

    def add(self, func, args, kwargs, out) -> None:
        cost = op_cost(func, args, kwargs, out)
        if cost is FREE:
            return
        ticks = self.cost.compute_ticks(cost, op_dtype(out))
        where = phase()
        self.ops += 1
        self.flops += cost.flops
        self.bytes += cost.bytes
        self.ticks += ticks
        self.ticks_by_class[cost.kind] += ticks
        self.flops_by_class[cost.kind] += cost.flops
        self.ops_by_class[cost.kind] += 1
        self.ticks_by_phase[where] += ticks
        self.flops_by_phase[where] += cost.flops
        self.ops_by_name[func.overloadpacket.__name__] += 1

    def __enter__(self) -> Tally:
        self._mode = _TallyMode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    def __str__(self) -> str:
        parts = ", ".join(f"{kind} {self.ticks_by_class[kind]:,}" for kind in OP_CLASSES if self.ops_by_class[kind])
        return (f"{self.ops:,} ops, {self.flops:,} FLOPs, {self.bytes:,} bytes, {self.ticks:,} ticks"
                + (f" ({parts})" if parts else ""))


class _TallyMode(TorchDispatchMode):
    def __init__(self, tally: Tally):
        super().__init__()
        self.tally, self.labels = tally, []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # as the ranks' mode: nothing to compile, and importing dynamo is slow
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if rule_for(func) is DECOMPOSE:  # (as the rank's mode: a composite op reached whole, its parts counted)
            with self:
                return func.decompose(*args, **kwargs)
        out = func(*args, **kwargs)
        if not follow_labels(func, args, self.labels):
            self.tally.add(func, args, kwargs, out)
        return out


def tally(cost: CostModel | None = None) -> Tally:
    """A context manager that counts what the code inside it costs on the simulated GPU (`cost`'s device)."""
    return Tally(cost or CostModel())
