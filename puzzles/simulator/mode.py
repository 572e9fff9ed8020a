"""The dispatch mode: every aten op a simulated rank runs passes through `_RankMode.__torch_dispatch__`.

There the op is checked (a tensor that lives on another rank raises IsolationError; one that an async op has not
released yet raises InFlightError), the storages it makes are charged to the rank's memory ledger (memory.py),
and its cost (FLOPs and bytes, op_costs.py) advances the rank's compute clock (clock.py). Once the run has stopped, every op of the rank's
thread raises, so that the thread unwinds even through a loop that catches the first stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import guards, host
from .clock import FREE, charge_compute, follow_labels, op_cost
from .memory import AT_IMPORT
from .types import IsolationError, _Abort

if TYPE_CHECKING:
    from .world import World, _RankState


# --------------------------------------------------------------------------------------------------------------
# The dispatch mode: every op a rank runs passes through here.


# torch.tensor([...]) builds its tensor outside the dispatcher, then hands it to lift_fresh: that input is new
# memory of the calling rank, not a tensor from elsewhere.
_LIFTS = {op for name in ("lift_fresh", "lift_fresh_copy", "lift") for op in
          (getattr(getattr(torch.ops.aten, name, None), o, None) for o in ("default",)) if op is not None}


_ITEM = torch.ops.aten._local_scalar_dense.default


def _tensors_in(args, kwargs) -> list[torch.Tensor]:
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found


def _tensors_out(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [x for x in out if isinstance(x, torch.Tensor)]
    return []


class _RankMode(TorchDispatchMode):
    """Sees every aten op of one rank: checks isolation, charges memory, advances the compute clock."""

    def __init__(self, world: World, me: _RankState):
        super().__init__()
        self.world, self.me = world, me

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in a dynamo guard, importing torch._dynamo (2 s) on the first op
        # and adding a layer to every op; nothing is compiled inside a simulated rank.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        me, world = self.me, self.world
        if me.untracked:
            return func(*args, **kwargs)
        if world.aborted:  # the run has stopped: this rank's thread must unwind, whatever it catches
            raise _Abort
        if me.loading:  # the rank's own module being imported (sim.run's make_fn): its tensors, on its ledger
            out = func(*args, **kwargs)
            site = world.sites.here()
            learners = world.charge_imports and site != "?" and not site.startswith("[harness]")  # (a notebook's
            # module is copied, not imported: those copies are the grader's lines, off the ledger)
            for t in _tensors_out(out):
                for st in guards.storages_of(t, me):
                    world.storage.adopt(st, me.rank, f"{site}  {AT_IMPORT}", charge=learners)
            return out
        if follow_labels(func, args, me.labels):
            return func(*args, **kwargs)

        owner_of = world.storage.owner
        for t in () if func in _LIFTS else _tensors_in(args, kwargs):
            for st in guards.storages_of(t, me):
                owner = owner_of.get(st._cdata)
                if owner != me.rank and not (owner is None and t.dim() == 0):  # 0-d: a Python number torch wrapped
                    raise IsolationError(world.isolation_message(me.rank, owner, t, f"aten.{func.__name__}"))
        if me.inflight and not func.is_view:
            world.check_inflight(me, func, args, kwargs)
        if func is _ITEM:  # a number read out of a tensor (.item(), float(t)): fine, a tensor's worth is not
            guards.count_item(me)

        out = func(*args, **kwargs)

        for t in _tensors_out(out):  # new storages, and storages an op grew in place (resize_, out=, set_)
            for st in guards.storages_of(t, me):
                world.storage.see(st, me.rank, world.sites.allocation_site)
        cost = op_cost(func, args, kwargs, out)
        if me.host is not None:  # Part IV: the host launches the op, ahead of the device (host.py)
            host.on_op(me, world, func, cost is not FREE)
        if cost is not FREE:
            me.flops += charge_compute(me.clock, me.rank, world.cost, cost, func, out, me.labels, world.sites.here)
        if me.host is not None:  # Part IV: an op whose result the host must see is a sync
            host.after_op(me, world, func, args, kwargs)
        return out
