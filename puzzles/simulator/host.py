"""The host: the CPU thread that runs a rank's Python and launches its kernels, ahead of the device.

On a GPU, `y = x @ w` does not wait for the product: the host puts the kernel in the device's queue and goes on,
so it runs ahead while the device works through the queue. A rank's time is then two timelines:

    host     |launch|launch|launch|.........waits.........|sync|launch|launch|
    device   |       |===== mm =====|== gelu ==|== add ==|      .....|== mm ==...
                                                          ^ loss.item(): the host needs a number, so it waits
                                                            for the device's queue to empty, and the device then
                                                            idles until the host has launched its next kernel

Each op costs the host `op_ticks` to launch (Python, the dispatcher, the launch call; a communication call too),
and a kernel starts when both the device is free and the host has launched it. While kernels take longer than
their launch, the host stays ahead and the device never waits. A **sync** (the host reads data the device
computes) ends that: the host waits until the device's queue is empty, then `sync_ticks` more for the copy back.
torch.cuda.set_sync_debug_mode("warn") flags the same calls on a real GPU:

    .item(), float(t), int(t), bool(t), `if t:`     a number out of a tensor (aten._local_scalar_dense)
    .tolist(), .cpu(), .numpy(), .to("cpu"), print(t), f"{t}"   the tensor's data copied to the host
    nonzero, masked_select, unique, x[mask], torch.equal, ...   ops whose output's shape depends on the data

Work the host does itself also costs host time: a data loader with `num_workers=0` loads each batch on the host
(loader.py). So a sync before loading the next batch leaves the device idle for the whole load.

Only a run that asks for it has a host (`sim.run(..., host=HostProfile(...))`; a puzzle sets it in its spec):
without one the device never waits for a launch and syncs cost nothing, which is how every puzzle of Parts I-III
is timed, so their figures do not change. With one, a rank's syncs and its host's work appear on its "host"
track (events of stream "host": a sync from the moment the host waits to the moment it has its data).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from .clock import Event, phase

_aten = torch.ops.aten


@dataclass(frozen=True)
class HostProfile:
    """The host's constants. op_ticks: to launch one op (a kernel, a communication call); sync_ticks: a sync's
    round trip once the device's queue is empty (a device-to-host copy, the host thread woken)."""

    name: str = "the puzzles' host"
    op_ticks: int = 8
    sync_ticks: int = 40

    def __post_init__(self):
        if self.op_ticks < 0 or self.sync_ticks < 0:
            raise ValueError(f"a HostProfile's ticks are not negative, got {self}")


def _ops(*names: str) -> frozenset:
    found = set()
    for name in names:
        packet = getattr(_aten, name, None)
        if packet is not None:
            found.update(getattr(packet, o) for o in packet.overloads())
    return frozenset(found)


# Ops whose result the host must see before it can go on: a number read out (item), or an output whose shape
# depends on the data (torch must know how many elements came out before it can allocate the result). These are
# what torch's fake tensors refuse to compute without data (DataDependentOutputException and
# DynamicOutputShapeException; tests/test_sim_host.py holds the two lists together).
SYNC_OPS = _ops("_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
                "unique_consecutive", "unique_dim_consecutive", "equal", "is_nonzero", "bincount")
_INDEX_OPS = _ops("index", "index_put", "index_put_", "_index_put_impl_")  # a sync with a boolean mask only
_REPEAT_INTERLEAVE = _ops("repeat_interleave")


def is_sync(func, args, kwargs) -> bool:
    """Whether the host must see this op's result before it can go on."""
    if func in SYNC_OPS:
        return True
    if func in _INDEX_OPS:  # x[mask], x[mask] = v: the mask's count of True decides the shape
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    if func in _REPEAT_INTERLEAVE:  # repeats given as a tensor, no output_size: the output's length is their sum
        repeats = args[0] if func._overloadname == "Tensor" else (args[1] if len(args) > 1 else kwargs.get("repeats"))
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    return False


class HostTimeline:
    """One rank's host: the tick it has reached, and its syncs."""

    def __init__(self, profile: HostProfile, rank: int):
        self.profile, self.rank, self.now = profile, rank, 0
        self.syncs: list[Event] = []

    def launch(self, clock) -> None:
        """The host launches one op: no kernel (or communication) of it starts before the launch is done."""
        self.now += self.profile.op_ticks
        if clock.compute < self.now:
            clock.compute = self.now

    def sync(self, clock, what: str, site: str, label: str = "") -> None:
        """The host waits for the device's queue to empty, then for the copy back."""
        start = self.now
        self.now = max(self.now, clock.compute) + self.profile.sync_ticks
        event = Event(self.rank, "host", "sync", start, self.now, site=site, op=what, label=label)
        clock.events.append(event)
        self.syncs.append(event)

    def work(self, clock, ticks: int, kind: str, site: str, label: str = "", op: str = "") -> None:
        """The host does `ticks` of its own work (a batch loaded in the main process)."""
        start = self.now
        self.now += ticks
        if ticks:
            clock.events.append(Event(self.rank, "host", kind, start, self.now, site=site, op=op, label=label))

    def wait_for(self, clock, tick: int, kind: str, site: str, label: str = "", op: str = "") -> None:
        """The host waits until `tick` (a batch a worker has not finished loading)."""
        if tick > self.now:
            clock.events.append(Event(self.rank, "host", kind, self.now, tick, site=site, op=op, label=label))
            self.now = tick


# ---- the syncs that are Python methods (no aten op shows them): patched while a run with a host is on

_METHODS = ("tolist", "cpu", "numpy", "__repr__", "__format__", "to")
_lock = threading.Lock()
_users = 0
_saved: list[tuple] = []
_local = threading.local()  # .inside: a sync method is running (printing calls tolist and item: one sync)


def _rank_host():
    """The calling rank's state when it has a host and its own code is running, else None."""
    from . import guards

    who = guards.caller()
    return who if who is not None and getattr(who, "host", None) is not None else None


def _to_host(name, args, kwargs) -> bool:
    if name != "to":
        return True
    device = kwargs.get("device", args[0] if args else None)
    return (isinstance(device, str) and device.startswith("cpu")) or (isinstance(device, torch.device)
                                                                      and device.type == "cpu")


def _synced(name: str, original):
    def method(self, *args, **kwargs):
        who = _rank_host() if not getattr(_local, "inside", False) else None
        if who is None or not _to_host(name, args, kwargs):
            return original(self, *args, **kwargs)
        site = who.site()
        if not site.startswith("[harness]"):
            who.host.sync(who.clock, f".{name.strip('_')}()", site, who.labels[-1] if who.labels else "")
        _local.inside = True
        try:
            return original(self, *args, **kwargs)
        finally:
            _local.inside = False

    method.__name__ = method.__qualname__ = name
    method.__wrapped__ = original
    return method


def install() -> None:
    """Patch the tensor methods that copy data to the host (once, for the first of several runs)."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        for name in _METHODS:
            own = vars(torch.Tensor).get(name)
            _saved.append((name, own))
            setattr(torch.Tensor, name, _synced(name, getattr(torch.Tensor, name)))


def uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users:
            return
        for name, own in reversed(_saved):
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)
        _saved.clear()


def on_op(me, world, func, costed: bool) -> None:
    """The dispatch mode's hook (mode.py), before the op is charged: the host launches it. The harness's own forward
    ops (zeroing gradients, keeping results) are free on the device, and on the host too."""
    if costed and not (phase() == "forward" and world.sites.here().startswith("[harness]")):
        me.host.launch(me.clock)


def after_op(me, world, func, args, kwargs) -> None:
    """After the op ran: an op whose result the host must see is a sync (once: printing a tensor, a sync of its
    own, calls item() and tolist() inside)."""
    if is_sync(func, args, kwargs) and not getattr(_local, "inside", False):
        site = world.sites.here()
        if not site.startswith("[harness]"):
            me.host.sync(me.clock, func.overloadpacket.__name__, site, me.labels[-1] if me.labels else "")


def start(world, profile: HostProfile | None) -> None:
    """Give every rank of the run a host (sim.run's host=), or none."""
    if profile is not None and not isinstance(profile, HostProfile):
        raise TypeError(f"host= takes a HostProfile (or None), got {profile!r}")
    for r in world.ranks:
        r.host = HostTimeline(profile, r.rank) if profile is not None else None
    world.host_profile = profile
