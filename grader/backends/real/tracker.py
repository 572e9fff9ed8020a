"""The tracker each real process runs: the simulator's memory ledger and FLOP count, and the communication
it sees (c10d's collectives are dispatcher ops), so that real processes are measured like simulated ranks.
See this folder's __init__.py for the whole picture."""


from __future__ import annotations

import collections
import contextlib
import os
import sys
import types

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from puzzles.simulator import guards
from puzzles.simulator.clock import FREE, CostModel, Event, RankClock, charge_compute, follow_labels, op_cost, phase
from puzzles.simulator.memory import AT_IMPORT, Ledger, SiteFinder, StorageTracker, place_inputs, private_copy
from puzzles.simulator.op_costs import DECOMPOSE, REFUSED, refusal, rule_for
from puzzles.simulator.types import UncostedOpError


PLACED_SITE = "input placed on the rank by the launcher"
_ITEM = torch.ops.aten._local_scalar_dense.default
# torch.tensor([...]) makes its storage outside the dispatcher and hands it to lift_fresh, a view op: that storage
# is the rank's new memory all the same (the simulator's mode.py charges it too).
_LIFTS = {op for name in ("lift_fresh", "lift_fresh_copy", "lift") for op in
          (getattr(getattr(torch.ops.aten, name, None), o, None) for o in ("default",)) if op is not None}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_DIST_DIR = os.path.join(_TORCH_DIR, "distributed") + os.sep
_DISPATCH_FILES = {os.path.join(_TORCH_DIR, "_ops.py"), os.path.join(_TORCH_DIR, "utils", "_python_dispatch.py"),
                   os.path.abspath(__file__)}

# In each process: the tracker (the simulator's ledger and FLOP count, and the communication it sees).




def _nbytes(x) -> int:
    """Bytes of a tensor, or of every tensor in a (nested) list of them."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


# c10d op -> (the simulator's name for it, which argument holds the buffer whose bytes the simulator counts).
# The simulator's `nbytes`: all_reduce and broadcast the tensor; all_gather and all_gather_into_tensor the gathered
# (full) output; reduce_scatter_tensor the full input; send/recv the message; barrier nothing.
# The async ops whose result gloo copies into the output inside work.wait(), in the caller's thread (measured on
# torch 2.13 under a dispatch mode: reduce_scatter_tensor runs split + copy_ there; recv, all_reduce, all_gather,
# broadcast and all_to_all run nothing). Only these outputs are pending: marking every async output pending left a
# recv's storage in the set forever, and a later tensor at the same address had its first in-place op taken for a
# delivery (p15's dq.add_, 40 ticks off the clock on gloo only).
DELIVERED_BY_COPY = frozenset({"_reduce_scatter_base_"})

COMM_OPS = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce_coalesced", 0),
    "allgather_": ("all_gather", 0),
    "_allgather_base_": ("all_gather_into_tensor", 0),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", 0),
    "reduce_scatter_": ("reduce_scatter", 1),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", 1),
    "broadcast_": ("broadcast", 0),
    "reduce_": ("reduce", 0),
    "gather_": ("gather", 1),
    "scatter_": ("scatter", 0),
    "alltoall_": ("all_to_all", 1),
    "alltoall_base_": ("all_to_all_single", 1),
    "send": ("send", 0),
    "recv_": ("recv", 0),
    "recv_any_source_": ("recv", 0),
    "barrier": ("barrier", None),
    "monitored_barrier_": ("barrier", None),
}


def _all_to_all_sent(name: str, args, me: int, n: int, nbytes: int) -> int:
    """What an all-to-all sends to the other ranks (the simulator's wire bytes): its input less the part it keeps.
    Any other op: `nbytes` itself, which the cost model turns into wire bytes."""
    if name == "alltoall_base_":
        inp, splits = args[1], list(args[4])
        rows = inp.shape[0] if inp.dim() else 1
        kept = splits[me] if splits else rows // n
        return nbytes - kept * (nbytes // rows if rows else 0)
    if name == "alltoall_":
        return nbytes - _nbytes(args[1][me])
    return nbytes


def _process_group_of(args):
    for a in args:
        if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
            try:
                return dist.ProcessGroup.unbox(a)
            except Exception:  # a torch without unbox: fall back to the default group
                return None
    return None


def _blocking(func, args, kwargs) -> bool:
    """Whether the caller waits for this op before going on: async_op=False, or dist.send / dist.recv (the same
    c10d op serves isend and irecv, so the Python caller decides)."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "async_op":
            value = args[i] if i < len(args) else kwargs.get("async_op", a.default_value)
            return not value
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_DIST_DIR) and frame.f_code.co_name in ("send", "recv"):
            return True
        frame = frame.f_back
    return False


def _through_private_buffers(func, args, kwargs, writes: bool = True):
    """Run a blocking c10d op on private copies of its tensors, then copy the result into the learner's.

    Why: the backend's work object holds the tensors it was given, and gloo's worker thread drops its reference a
    moment after wait() returns, racing the learner's thread. A tensor the learner lets go right after a
    collective would then leave the ledger sometimes at once, sometimes a few ops later: peaks that change from
    run to run. The simulator's collectives hold nothing once done; with private copies (off the ledger, as the
    backend's own buffers are) the learner's tensors are freed exactly when the learner drops them, on every run.
    Values are untouched: the same bytes go through the same gloo collective."""
    tensors = [t for a in args for t in _flat_tensors(a)]
    if _done_work is None or not tensors or not all(t.is_contiguous() for t in tensors) or (
            torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return func(*args, **kwargs)  # let the backend see (and judge) the learner's own tensors
    copies: dict = {}  # id(learner tensor) -> (learner tensor, private copy)
    out = func(*[_swap(a, copies) for a in args], **kwargs)
    work = out[-1] if isinstance(out, (tuple, list)) else out
    work.wait()
    for t in _flat_tensors(args[0]) if writes else ():  # the op writes into its first argument
        learner, copy = copies[id(t)]
        learner.data.copy_(copy)  # .data: a backend write bumps no autograd version counter; neither does this
    back = {id(copy): learner for learner, copy in copies.values()}
    # The caller will wait() on what the op returns: hand it a finished work (gloo's recv work cannot be waited
    # for twice), and let gloo's own work, with the private copies, go.
    if isinstance(out, (tuple, list)):
        return type(out)((*_unswap(tuple(out[:-1]), back), _done_work()))
    return _done_work()


def _async_through_private_buffers(func, args, kwargs):
    """An async all-reduce on private copies, as _through_private_buffers runs a blocking op, for the same reason:
    each of gloo's worker threads keeps the last work it ran until it runs another, so a gradient the learner drops
    after wait() (w.grad = None after an all-reduce launched from a hook) would leave the ledger only during the
    next step's backward, where the simulator frees it at once. Here gloo's work holds the copies; the result is
    copied into the learner's tensors when gloo's work completes, and the work handed to the caller completes only
    after that copy, so wait() gives what it gives on gloo."""
    tensors = [t for a in args for t in _flat_tensors(a)]
    if _done_work is None or not tensors or not all(t.is_contiguous() for t in tensors) or (
            torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return func(*args, **kwargs)
    copies: dict = {}
    out = func(*[_swap(a, copies) for a in args], **kwargs)
    pairs = [copies[id(t)] for t in _flat_tensors(args[0])]
    done = torch.futures.Future()

    def deliver(finished):
        try:
            finished.wait()
            for learner, copy in pairs:
                learner.data.copy_(copy)  # in gloo's thread: no rank's ledger or clock sees it (a delivery)
            done.set_result(None)
        except Exception as exc:  # gloo's own error (a timeout): the caller's wait() raises it
            done.set_exception(exc)

    work = out[-1]
    if isinstance(work, torch.ScriptObject):  # a dispatcher op returns the TorchScript form
        work = dist.Work.unbox(work)
    work.get_future().add_done_callback(deliver)
    back = {id(copy): learner for learner, copy in copies.values()}
    from torch._C._distributed_c10d import _create_work_from_future

    return type(out)((*_unswap(tuple(out[:-1]), back), _create_work_from_future(done).boxed()))


def _done_work():
    future = torch.futures.Future()
    future.set_result(None)
    return _create_work_from_future(future).boxed()  # a dispatcher op returns the TorchScript form


try:
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError:  # a torch without it: blocking ops then go straight to the backend
    _done_work = None  # noqa: F811


def _swap(a, copies: dict):
    if isinstance(a, torch.Tensor):
        if id(a) not in copies:
            copies[id(a)] = (a, a.detach().clone())
        return copies[id(a)][1]
    if isinstance(a, (list, tuple)):
        return type(a)(_swap(v, copies) for v in a)
    return a


def _unswap(o, back: dict):
    if isinstance(o, torch.Tensor):
        return back.get(id(o), o)
    if isinstance(o, (list, tuple)):
        return type(o)(_unswap(v, back) for v in o)
    return o


def _flat_tensors(a) -> list:
    if isinstance(a, torch.Tensor):
        return [a]
    if isinstance(a, (list, tuple)):
        return [t for v in a for t in _flat_tensors(v)]
    return []


def _in_runtime() -> bool:
    """True when the op was called from torch.distributed's own Python code (the 1-element tensor gloo's barrier
    makes, the buffers of object collectives): the runtime's memory, which the simulator does not charge either."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in _DISPATCH_FILES:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_DIST_DIR)


class ProcessTracker(TorchDispatchMode):
    """One process's rank, seen op by op: its memory ledger, its FLOPs in ticks, its communication events.

    The ledger and storage tracker are the simulator's own classes; `place` copies the harness's inputs onto the
    rank as sim.run does. The ledger's clock is the FLOP clock (compute ticks laid end to end)."""

    def __init__(self, rank: int, cost: CostModel, library_files=(), device=None, harness_files=()):
        super().__init__()
        self.rank, self.cost, self.device = rank, cost, device
        self.clock = RankClock()
        self.ledger = Ledger(rank, lambda: self.clock.compute)
        self.storage = StorageTracker({rank: self.ledger})
        self.sites = SiteFinder([*library_files, __file__], harness_files)
        self.labels: list[str] = []
        self.untracked = False
        self.flops = 0
        self.items_read = 0  # numbers read out of tensors one at a time (puzzles/simulator/guards.py)
        self.site = self.sites.here
        self.waiting = None  # the communication op this rank is blocked in, if any
        self.pending_outputs: set = set()  # storages of async collectives' outputs that gloo has yet to write

    def adopt_storage(self, storage) -> None:
        """A storage torch made outside an op the tracker sees (get_rng_state's): this rank's (guards.py)."""
        self.storage.adopt(storage, self.rank, self.sites.allocation_site())

    def guard_caller(self):
        """This process's rank while its own code runs (not the tracker's or torch.distributed's own work)."""
        return None if self.untracked else self

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # as the simulator's mode: nothing is compiled on a graded rank
        return False

    @contextlib.contextmanager
    def untracked_ops(self):
        self.untracked = True
        try:
            yield
        finally:
            self.untracked = False

    def charge_module(self, module) -> None:
        """Charge the tensors the learner's module made at import, as the simulator does (there, every storage
        the import makes; here, imported before the tracker exists, the tensors reachable from the module:
        its globals, their containers and objects, its classes' attributes, its functions' defaults and
        closures)."""
        made, seen = [], set()
        for name, t in module_tensors(module):
            for storage in guards.storages_of(t, self):  # (a sparse tensor's parts; a subclass is refused)
                if storage._cdata not in seen:
                    seen.add(storage._cdata)
                    self.storage.adopt(storage, self.rank, f"{name}  {AT_IMPORT}")
                    made.append((f"{name} (a global of your file)", storage.nbytes()))
        guards.check_import(self.rank, made)

    def place(self, value):
        """A private copy of the harness's tensors on this rank (on its device), charged to its ledger."""
        def copy_tensor(t):
            with self.untracked_ops():
                copy = private_copy(t, self.device)
            self.storage.adopt(copy.untyped_storage(), self.rank, PLACED_SITE)
            return copy

        return place_inputs(value, copy_tensor)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """Charge each new storage an op makes to this rank. A view op makes none (but torch.tensor's lift_fresh,
        whose storage is new memory): a storage first seen as the
        output of one was made outside the tracked ops, by the runtime (gloo's async reduce_scatter_tensor splits
        its own flat buffer inside work.wait(), in the caller's thread: measured, 262,144 bytes charged to the
        learner's wait() line before this rule), and is not the learner's."""
        kwargs = kwargs or {}
        if self.untracked:
            return func(*args, **kwargs)
        if follow_labels(func, args, self.labels):
            return func(*args, **kwargs)
        if func.namespace == "c10d":
            return self._communicate(func, args, kwargs)
        if func is _ITEM:
            guards.count_item(self)
        rule = rule_for(func)
        if rule is REFUSED and not _in_runtime():  # (allowed.py: no cost formula, no run)
            raise UncostedOpError(f"rank {self.rank} ran {refusal(func)}. (At {self.sites.here()}.)")
        if rule is DECOMPOSE:  # (a composite op reached whole, under inference_mode: its parts, each charged)
            with self:
                return func.decompose(*args, **kwargs)
        out = func(*args, **kwargs)
        outs = out if isinstance(out, (list, tuple)) else (out,)
        runtime = None
        for t in outs:
            if not isinstance(t, torch.Tensor):
                continue
            for st in guards.storages_of(t, self):  # (a sparse tensor's parts; a subclass is refused)
                if st._cdata in self.storage.owner:  # grown in place (resize_, out=, set_)?
                    self.storage.see(st, self.rank, self.sites.allocation_site)
                elif not func.is_view or func in _LIFTS:
                    if runtime is None:
                        runtime = _in_runtime()
                    if not runtime:
                        self.storage.adopt(st, self.rank, self.sites.allocation_site())
        cost = op_cost(func, args, kwargs, out)
        if cost is not FREE and not self._delivery(func, args):
            self.flops += charge_compute(self.clock, self.rank, self.cost, cost, func, out, self.labels,
                                         self.sites.here)
        return out

    def _delivery(self, func, args) -> bool:
        """Whether an op is gloo delivering an async collective's result: a write into that collective's output,
        which gloo makes in the caller's thread inside work.wait() (measured: a copy_ per reduce_scatter_tensor).
        The simulator's collectives move data off the clock; so does this, once per output."""
        if not self.pending_outputs or not args or not isinstance(args[0], torch.Tensor):
            return False
        schema = func._schema.arguments
        if not schema or schema[0].alias_info is None or not schema[0].alias_info.is_write:
            return False
        try:
            key = args[0].untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):
            return False
        if key in self.pending_outputs:
            self.pending_outputs.discard(key)
            return True
        return False

    def _communicate(self, func, args, kwargs):
        name = func._schema.name.split("::")[-1]
        kind, which = COMM_OPS.get(name, (name, None))
        pg = _process_group_of(args)
        try:
            ranks = tuple(dist.get_process_group_ranks(pg)) if pg is not None else tuple(range(dist.get_world_size()))
        except Exception:  # a group this process does not know by that object
            ranks = tuple(range(dist.get_world_size()))
        peer = None
        if kind == "send":
            peer = ranks[args[2]]
            peers = (self.rank, peer)
        elif kind == "recv":
            peer = ranks[args[2]] if name == "recv_" else None
            peers = (-1 if peer is None else peer, self.rank)
        else:
            peers = ranks
        site = self.sites.here()
        self.waiting = {"kind": kind, "peer": peer, "site": site}  # what this rank waits in, should it hang
        if name != "recv_any_source_" and _blocking(func, args, kwargs):
            out = _through_private_buffers(func, args, kwargs, writes=kind not in ("send", "barrier"))
        elif name == "allreduce_":
            out = _async_through_private_buffers(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
            if name in DELIVERED_BY_COPY:  # gloo writes its first argument later, in wait(), by a copy_
                for t in _flat_tensors(args[0]):
                    try:
                        self.pending_outputs.add(t.untyped_storage()._cdata)
                    except (RuntimeError, NotImplementedError):
                        pass
        self.waiting = None
        nbytes = _nbytes(args[which]) if which is not None else 0
        sent = _all_to_all_sent(name, args, ranks.index(self.rank) if self.rank in ranks else 0, len(ranks), nbytes)
        tick = self.clock.compute
        self.clock.events.append(Event(self.rank, "comm", kind, tick, tick, nbytes=nbytes,
                                       wire_bytes=self.cost.wire_bytes(kind, sent, len(ranks)),
                                       phase=phase(),
                                       peers=peers, site=site, label=self.labels[-1] if self.labels else ""))
        return out


def module_tensors(module, depth: int = 6) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor a module holds: in its globals, in the lists, tuples, dicts, sets and deques
    they hold, in the attributes of objects and classes defined in it, in its functions' defaults and closures."""
    if module is None:
        return []
    home = getattr(module, "__name__", None)
    found, seen = [], set()

    def walk(x, path, level):
        if id(x) in seen or level > depth:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            found.append((path, x))
        elif isinstance(x, dict):
            for k, v in list(x.items()):
                walk(v, f"{path}[{k!r}]", level + 1)
        elif isinstance(x, (list, tuple, set, frozenset, collections.deque)):
            for i, v in enumerate(list(x)):
                walk(v, f"{path}[{i}]", level + 1)
        elif isinstance(x, types.FunctionType) and x.__module__ == home:
            for i, v in enumerate((x.__defaults__ or ()) + tuple((x.__kwdefaults__ or {}).values())):
                walk(v, f"{path}'s default {i}", level + 1)
            for i, cell in enumerate(x.__closure__ or ()):
                try:
                    walk(cell.cell_contents, f"{path}'s closure {i}", level + 1)
                except ValueError:  # an empty cell
                    pass
        elif (isinstance(x, type) and x.__module__ == home) or getattr(type(x), "__module__", None) == home:
            for k, v in list((getattr(x, "__dict__", None) or {}).items()):  # (an object with __slots__ has none)
                walk(v, f"{path}.{k}", level + 1)

    for name, value in list(vars(module).items()):
        if not name.startswith("__"):
            walk(value, name, 0)
    return found

