"""The dispatch mode: every aten op a simulated rank runs passes through `_RankMode.__torch_dispatch__`.

There the op is checked (a tensor that lives on another rank raises IsolationError; one that an async op has not
released yet raises InFlightError), the storages it makes are charged to the rank's memory ledger (memory.py),
and its cost (FLOPs and bytes, op_costs.py) advances the rank's compute clock (clock.py). Once the run has stopped, every op of the rank's
thread raises, so that the thread unwinds even through a loop that catches the first stop.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import allowed, escapes, guards, host
from .clock import _RECORD_ENTER, _RECORD_EXIT, FREE, charge_op, follow_labels, op_dtype, slowed
from .guards import storages_of
from .memory import AT_IMPORT
from .op_costs import DECOMPOSE, REFUSED, OpCost, cost_parts, refusal, rule_for
from .types import IsolationError, UncostedOpError, _Abort

if TYPE_CHECKING:
    from .world import World, _RankState


# --------------------------------------------------------------------------------------------------------------
# The dispatch mode: every op a rank runs passes through here.


# torch.tensor([...]) builds its tensor outside the dispatcher, then hands it to lift_fresh: that input is new
# memory of the calling rank, not a tensor from elsewhere.
_LIFTS = {op for name in ("lift_fresh", "lift_fresh_copy", "lift") for op in
          (getattr(getattr(torch.ops.aten, name, None), o, None) for o in ("default",)) if op is not None}


_ITEM = torch.ops.aten._local_scalar_dense.default
_TENSOR, _STRIDED, _SEQUENCES = torch.Tensor, torch.strided, (list, tuple)  # (each a lookup saved per op)
_AUTOGRAD_NODE = torch._C._current_autograd_node  # the node autograd's engine runs now (None: not in backward)


def _tensors_in(args, kwargs) -> list[torch.Tensor]:
    found = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, _TENSOR):
            found.append(a)
        elif isinstance(a, _SEQUENCES):
            found.extend(x for x in a if isinstance(x, _TENSOR))
    return found


def _tensors_out(out) -> list[torch.Tensor]:
    if isinstance(out, _TENSOR):
        return [out]
    if isinstance(out, _SEQUENCES):
        return [x for x in out if isinstance(x, _TENSOR)]
    return []


class _Op:
    """What the mode needs to know of one aten op, found the first time the run meets it: a dozen lookups of an
    OpOverload in sets and dicts, each hashed in Python, were a tenth of an op's cost (measured)."""

    __slots__ = ("func", "call", "labels", "lift", "view", "item", "rule", "name")

    def __init__(self, func):
        self.func = func
        # What calling it runs: OpOverload.__call__ is a Python frame that calls its _op (2,000 instructions a call)
        self.call = func._op if isinstance(func, torch._ops.OpOverload) else func
        self.labels = func in _RECORD_ENTER or func in _RECORD_EXIT  # record_function's ops (clock.follow_labels)
        self.lift = func in _LIFTS
        self.view = func.is_view
        self.item = func is _ITEM
        self.rule = None  # how op_costs charges it (rule_for), looked up the first time it is charged
        self.name = func.overloadpacket.__name__


_OWN = allowed._busy


class _RankMode(TorchDispatchMode):
    """Sees every aten op of one rank: checks isolation, charges memory, advances the compute clock."""

    def __init__(self, world: World, me: _RankState):
        super().__init__()
        self.world, self.me = world, me
        self.ops = world.ops  # func._op (or func) -> _Op, shared by the ranks of the run
        self.costs = world.costs  # ((FLOPs, bytes, class), dtype) -> (its OpCost, its ticks)
        self.ticks_vary = getattr(world.cost, "ticks_vary", False)  # (cost.py: then its ticks are asked every time)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in a dynamo guard, importing torch._dynamo (2 s) on the first op
        # and adding a layer to every op; nothing is compiled inside a simulated rank.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        me, world = self.me, self.world
        if me.untracked:  # (the runtime's own work switches dispatch off too: an op here is a rank's, unless ours)
            if escapes.runtime_is_calling():
                return func(*args, **kwargs)
            raise IsolationError(f"rank {me.rank} switched the simulator's own flag `untracked` on (found at "
                                 f"{world.sites.here()}): the simulator's objects are not a rank's to change. No "
                                 f"puzzle needs it; leave dist's private attributes alone.")
        if world.aborted:  # the run has stopped: this rank's thread must unwind, whatever it catches
            raise _Abort
        if me.loading:  # the rank's own module being imported (sim.run's make_fn): its tensors, on its ledger
            return self._while_loading(func, args, kwargs)
        try:  # (an OpOverload is filed under its _op: id() is audited by Python, and the op's own hash is Python)
            key = func._op
        except AttributeError:
            key = func
        op = self.ops.get(key)
        if op is None:
            op = self.ops[key] = _Op(func)
        if op.labels and follow_labels(func, args, me.labels):
            return func(*args, **kwargs)
        rule = op.rule
        if rule is None:
            rule = op.rule = rule_for(func)
        if rule is REFUSED:  # (allowed.py: an op runs on a rank only if op_costs.py can charge it)
            raise UncostedOpError(f"rank {me.rank} ran {refusal(func)}. (At {world.sites.here()}.)")
        if rule is DECOMPOSE:  # (a composite op that reached the mode whole: the ops it is made of, each charged)
            with self:
                return func.decompose(*args, **kwargs)

        rank, storage = me.rank, world.storage
        if not op.lift:  # (torch.tensor's wrap: its input is new memory of this rank, not a tensor from elsewhere)
            owner_of = storage.owner
            for t in _tensors_in(args, kwargs):
                stores = None
                if type(t) is _TENSOR and t.layout is _STRIDED:  # storages_of's common case, inline
                    try:
                        stores = (t.untyped_storage(),)
                    except (RuntimeError, NotImplementedError):  # (storages_of refuses such a tensor)
                        pass
                for st in stores or storages_of(t, me):
                    owner = owner_of.get(st._cdata)
                    if owner != rank and not (owner is None and t.dim() == 0):  # 0-d: a Python number torch wrapped
                        raise IsolationError(world.isolation_message(rank, owner, t, f"aten.{func.__name__}"))
        if me.inflight and not op.view:
            world.check_inflight(me, func, args, kwargs)
        if op.item:  # a number read out of a tensor (.item(), float(t)): fine, a tensor's worth is not
            guards.count_item(me)

        out = op.call(*args, **kwargs)

        if rule is FREE:  # a view (or an op that launches no kernel): its storage is seldom new, and its line is
            allocated = world.sites.allocation_site  # found only then
        else:
            # The learner's line and the phase, found once for the ledger and the clock (allocation_site and
            # charge_compute find them with the same walk from further down, past the simulator's own frames).
            _OWN.on = True  # (the frame rule's own work: allowed.py; this is the simulator's frame, once per op)
            try:
                where = world.sites.site_at(sys._getframe(1))
            finally:
                _OWN.on = False
            node = _AUTOGRAD_NODE()
            allocated = where if node is None else f"{where}  [backward: {node.name()}]"
        for t in _tensors_out(out):  # new storages, and storages an op grew in place (resize_, out=, set_)
            stores = None
            if type(t) is _TENSOR and t.layout is _STRIDED:  # (as above)
                try:
                    stores = (t.untyped_storage(),)
                except (RuntimeError, NotImplementedError):
                    pass
            for st in stores or storages_of(t, me):
                storage.see(st, rank, allocated)
        if rule is FREE:
            if me.host is not None:  # Part IV: an op whose result the host must see is a sync (host.py)
                host.after_op(me, world, func, args, kwargs)
            return out
        parts = cost_parts(rule, func, args, kwargs, out)
        dtype = out.dtype if type(out) is _TENSOR else op_dtype(out)  # (op_dtype's common case)
        charged = self.costs.get((parts, dtype))  # (a step's ops cost the same at every step: found once)
        if charged is None:
            cost = OpCost(*parts)
            charged = self.costs[parts, dtype] = (cost, world.cost.compute_ticks(cost, dtype))
        elif self.ticks_vary:  # a cost model whose op costs more while a collective is in flight (the predictor's)
            charged = (charged[0], world.cost.compute_ticks(charged[0], dtype))
        if me.host is not None:  # Part IV: the host launches the op, ahead of the device (host.py)
            host.on_op(me, world, func, True)
        me.flops += charge_op(me.clock, rank, slowed(world.cost, rank, charged[1]), charged[0], op.name, me.labels,
                              where, "forward" if node is None else "backward")
        if me.host is not None:  # Part IV: an op whose result the host must see is a sync
            host.after_op(me, world, func, args, kwargs)
        return out

    def _while_loading(self, func, args, kwargs):
        """An op of the rank's module while it is imported: its tensors are the rank's own, charged to it."""
        me, world = self.me, self.world
        out = func(*args, **kwargs)
        site = world.sites.here()
        learners = world.charge_imports and site != "?" and not site.startswith("[harness]")  # (a notebook's
        # module is copied, not imported: those copies are the grader's lines, off the ledger)
        for t in _tensors_out(out):
            for st in storages_of(t, me):
                world.storage.adopt(st, me.rank, f"{site}  {AT_IMPORT}", charge=learners)
        return out
