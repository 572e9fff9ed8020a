"""A simulated multi-rank runtime: N "GPUs" in one process, exchanging real tensors.

    result = sim.run(fn, world_size=4, args=(x, w))

runs `fn(dist, x, w)` once per rank, each rank in its own thread, with `dist` mirroring `torch.distributed`
(`get_rank`, `send`, `recv`, `all_reduce`, `all_gather`, `reduce_scatter_tensor`, `broadcast`, `barrier`, ...).
The same `fn` runs unchanged on real processes with `fn(torch.distributed, ...)`.

How it works, in four ideas:

1. **One rank runs at a time.** A baton passes between the rank threads only when a rank makes a communication
   call or returns, always to the next rank (in rank order) that can make progress. So every run interleaves the
   same way: no races, no flaky tests. Each rank keeps its own random-number state across switches.
2. **Communication is matching.** A call posts what the rank brings (a tensor to send, its part of an all-reduce)
   and blocks until its partners have posted theirs; then the data moves, by plain tensor copies. If every rank
   that has not returned is blocked, nobody can ever proceed: that is a deadlock, and the error says what each rank
   waits for and where. A blocking `send` waits for the matching `recv` (stricter than real backends, which may
   buffer small messages, so an unsafe ordering fails every time instead of sometimes).
3. **Each rank has its own memory.** Every op a rank runs is seen by a TorchDispatchMode: it records which rank
   owns each storage (an op that uses another rank's tensor raises IsolationError: data moves only by
   communication) and charges new storages to the rank's memory ledger (sim_memory.py).
4. **Each rank has a clock** with a compute and a communication stream (sim_clock.py). Compute costs FLOPs,
   messages cost latency + bytes/bandwidth, a collective starts when its last participant arrives, an async op
   runs on the comm stream and `wait()` joins it to the compute stream. Ticks are integers.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import enum
import gc
import threading
import time
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .sim_clock import CostModel, Event, RankClock, op_flops, record_function_ops
from .sim_memory import Ledger, SiteFinder, StorageTracker, describe_frame

__all__ = [
    "run", "current_ledger", "SimResult", "CostModel", "Event", "Ledger", "ReduceOp", "P2POp", "Work", "ProcessGroup",
    "SimError", "DeadlockError", "CollectiveMismatchError", "P2PMismatchError", "IsolationError",
    "TimeLimitError", "UnmatchedError", "InFlightError",
]


# --------------------------------------------------------------------------------------------------------------
# Errors: each names the ranks involved and the learner's lines.


class SimError(Exception):
    """Base class of the simulator's own errors."""


class DeadlockError(SimError):
    """Every rank that has not returned is blocked waiting for another: none can ever proceed."""


class CollectiveMismatchError(SimError):
    """Ranks met in one collective with different ops, shapes, dtypes, reduce ops, roots or groups."""


class P2PMismatchError(SimError):
    """A send and the recv it matched disagree on shape or dtype."""


class IsolationError(SimError):
    """An op on rank r used a tensor that lives on rank s (or on no rank)."""


class InFlightError(SimError):
    """A tensor was touched while an async op on it had not been waited for."""


class TimeLimitError(SimError):
    """A rank ran past the time limit without communicating or returning."""


class UnmatchedError(SimError):
    """Every rank returned, but a send, recv or collective that one of them posted was never matched."""


class _Abort(BaseException):
    """Raised inside a rank thread to unwind it when the run is stopped. Not an Exception, so `except Exception`
    in learner code does not swallow it."""


# --------------------------------------------------------------------------------------------------------------
# The vocabulary of torch.distributed: reduce ops, groups, P2POp, Work.


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"


def _reduce_op(op) -> ReduceOp:
    """Accept our ReduceOp or torch.distributed.ReduceOp.X (both have .name)."""
    if isinstance(op, ReduceOp):
        return op
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    try:
        return ReduceOp[name.upper()]
    except KeyError:
        raise ValueError(f"unsupported reduce op {op!r}; use dist.ReduceOp.SUM, AVG, PRODUCT, MIN or MAX") from None


class ProcessGroup:
    """A set of ranks that communicate together. `dist.group.WORLD` holds every rank; `dist.new_group(ranks)`
    makes sub-groups (say, the tensor-parallel and the data-parallel ranks of a 2-D layout)."""

    def __init__(self, world: World, gid: int, ranks: tuple[int, ...]):
        self._world, self.id, self.ranks = world, gid, ranks

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """The calling rank's position in this group (-1 if it is not a member), like ProcessGroup.rank()."""
        me = self._world.current_rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def __repr__(self):
        return {0: "WORLD", -1: "new_group calls"}.get(self.id, f"group{list(self.ranks)}")


class _NonGroupMember:
    def __repr__(self):
        return "GroupMember.NON_GROUP_MEMBER"


NON_GROUP_MEMBER = _NonGroupMember()


@dataclass
class P2POp:
    """One send or receive for `batch_isend_irecv`: `P2POp(dist.isend, tensor, peer)`."""

    op: object
    tensor: torch.Tensor
    peer: int | None = None
    group: ProcessGroup | None = None
    tag: int = 0
    group_peer: int | None = None


class Work:
    """What an async op returns. `wait()` blocks until the op is done and joins its end time into the
    compute stream; until then the tensors it reads may not be written and the tensors it writes may not be used."""

    def __init__(self, world: World, rank: int, what: str, site: str):
        self._world, self._rank, self.what, self.site = world, rank, what, site
        self._done = False
        self._end = 0
        self._waited = False
        self._source = None
        self._describe = lambda: what  # replaced by the op that owns this handle

    def is_completed(self) -> bool:
        # Counts as a communication call: it passes the baton, so a polling loop lets the partners progress.
        self._world.yield_baton(self._world.rank_state(self._rank))
        return self._done

    def wait(self, timeout=None) -> bool:
        self._world.wait(self._world.rank_state(self._rank), self)
        return True

    def source_rank(self) -> int | None:
        return self._source

    def _finish(self, end: int) -> None:
        """Mark the op done at tick `end`. Drop its description too: that closure holds the op's tensors and
        this handle, a reference cycle that would keep them on the ledger (sim.run turns the cycle collector off)."""
        self._done, self._end = True, end
        self._describe = lambda what=self.what: what

    def __repr__(self):
        return f"<Work {self.what} rank={self._rank} {'done' if self._done else 'pending'}>"


def _desc(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}[{', '.join(map(str, t.shape))}]"


# --------------------------------------------------------------------------------------------------------------
# What each collective does to the data. `calls` holds one entry per rank of the group, in group order.
# These functions are the whole semantics: read them to see what an all-reduce is.


def _reduce_into(out: torch.Tensor, tensors: list[torch.Tensor], op: ReduceOp) -> None:
    """out = tensors[0] (op) tensors[1] (op) ..., elementwise, in rank order (so every run gets the same bits).
    `out` may be tensors[0] itself."""
    out = out.data
    if (out.data_ptr(), out.shape, out.stride()) != (tensors[0].data_ptr(), tensors[0].shape, tensors[0].stride()):
        out.copy_(tensors[0])
    for t in tensors[1:]:
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            out += t
        elif op is ReduceOp.PRODUCT:
            out *= t
        elif op is ReduceOp.MIN:
            torch.minimum(out, t, out=out)
        else:
            torch.maximum(out, t, out=out)
    if op is ReduceOp.AVG:
        if out.is_floating_point() or out.is_complex():
            out /= len(tensors)
        else:
            out //= len(tensors)


def _all_reduce(calls):
    """[a] [b] [c] -> [a+b+c] [a+b+c] [a+b+c]: every rank ends with the reduction of every rank's tensor."""
    total = calls[0].tensor.data  # reduce into the first rank's tensor, then copy the result to the others
    _reduce_into(total, [c.tensor.data for c in calls], calls[0].op)
    for c in calls[1:]:
        c.tensor.data.copy_(total)


def _all_gather(calls):
    """[a] [b] [c] -> [a,b,c] [a,b,c] [a,b,c]: every rank ends with every rank's tensor, in rank order."""
    for c in calls:
        for i, src in enumerate(calls):
            c.tensor_list[i].data.copy_(src.tensor)


def _all_gather_into_tensor(calls):
    """Like all_gather, into one output tensor: the inputs concatenated along dim 0 (or stacked)."""
    for c in calls:
        with _flat(c.output) as out:
            rows = out.view(len(calls), -1)  # row i: rank i's input
            for i, src in enumerate(calls):
                rows[i].copy_(src.input.reshape(-1))


def _reduce_scatter_tensor(calls):
    """[a0 a1 a2] [b0 b1 b2] [c0 c1 c2] -> [a0+b0+c0] [a1+b1+c1] [a2+b2+c2]:
    rank i ends with the reduction of every rank's i-th chunk. Half of an all-reduce."""
    for i, c in enumerate(calls):
        chunks = [src.input.data.reshape(len(calls), -1)[i] for src in calls]
        with _flat(c.output) as out:
            _reduce_into(out, chunks, calls[0].op)


class _flat:
    """A flat, contiguous view of `t` to write into (a scratch copy if `t` is not contiguous)."""

    def __init__(self, t: torch.Tensor):
        self.t = t.data

    def __enter__(self) -> torch.Tensor:
        self.flat = self.t.view(-1) if self.t.is_contiguous() else torch.empty(self.t.numel(), dtype=self.t.dtype)
        return self.flat

    def __exit__(self, *exc):
        if not self.t.is_contiguous():
            self.t.copy_(self.flat.view(self.t.shape))


def _broadcast(calls):
    """[a] [.] [.] -> [a] [a] [a]: every rank ends with the root's tensor."""
    root = next(c for c in calls if c.is_root)
    for c in calls:
        if not c.is_root:
            c.tensor.data.copy_(root.tensor)


def _nothing(calls):
    """barrier: no data moves; nobody leaves before everybody has arrived."""


class _Call:
    """What one rank brought to one collective: its tensors and arguments, and what must agree across ranks."""

    def __init__(self, name: str, exchange, signature: dict, reads=(), writes=(), nbytes=0, **fields):
        self.name, self.exchange, self.signature = name, exchange, signature
        self.reads, self.writes, self.nbytes = list(reads), list(writes), nbytes
        self.__dict__.update(fields)
        self.rank = self.issued = self.work = self.site = None


@dataclass
class _Collective:
    """One collective in progress: call number `seq` on `group`, and the ranks that have arrived so far."""

    name: str
    group: ProcessGroup
    seq: int
    calls: dict = field(default_factory=dict)  # global rank -> _Call

    def where(self) -> str:
        return f"{self.name} (call #{self.seq} on {self.group})"


@dataclass
class _P2P:
    """A posted send or recv, waiting for its partner."""

    kind: str  # "send" or "recv"
    rank: int
    peer: int | None  # dst of a send; src of a recv (None: any source)
    tag: int
    group: ProcessGroup
    tensor: torch.Tensor
    issued: int
    site: str
    work: Work
    phase: str = ""

    def accepts(self, send: _P2P) -> bool:  # self is a recv
        return (send.peer == self.rank and (self.peer is None or self.peer == send.rank)
                and send.tag == self.tag and send.group is self.group)

    def describe(self) -> str:
        if self.kind == "send":
            return (f"send of {_desc(self.tensor)} to rank {self.peer} (tag {self.tag}) at {self.site}: "
                    f"rank {self.peer} has posted no matching recv")
        src = "any rank" if self.peer is None else f"rank {self.peer}"
        return (f"recv into {_desc(self.tensor)} from {src} (tag {self.tag}) at {self.site}: "
                f"{src} has posted no matching send")


# --------------------------------------------------------------------------------------------------------------
# The dispatch mode: every op a rank runs passes through here.


_RECORD_ENTER, _RECORD_EXIT = record_function_ops()
# torch.tensor([...]) builds its tensor outside the dispatcher, then hands it to lift_fresh: that input is new
# memory of the calling rank, not a tensor from elsewhere.
_LIFTS = {op for name in ("lift_fresh", "lift_fresh_copy", "lift") for op in
          (getattr(getattr(torch.ops.aten, name, None), o, None) for o in ("default",)) if op is not None}


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


def _span(t: torch.Tensor):
    """(storage key, first byte, one past the last byte) that tensor `t` can touch."""
    size = t.element_size()
    lo = t.storage_offset()
    hi = lo + (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1 if t.numel() else 0)
    return t.untyped_storage()._cdata, lo * size, hi * size


def _written_args(func, args, kwargs) -> list[torch.Tensor]:
    written = []
    positional = [a for a in func._schema.arguments if not a.kwarg_only]
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[i] if (i < len(args) and i < len(positional)) else kwargs.get(a.name)
        written.extend(_tensors_out(value))
    return written


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
        if me.untracked or world.aborted:
            return func(*args, **kwargs)
        if func in _RECORD_ENTER:
            me.labels.append(str(args[0]))
            return func(*args, **kwargs)
        if func in _RECORD_EXIT:
            if me.labels:
                me.labels.pop()
            return func(*args, **kwargs)

        owner_of = world.storage.owner
        for t in () if func in _LIFTS else _tensors_in(args, kwargs):
            try:
                owner = owner_of.get(t.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
                continue
            if owner != me.rank and not (owner is None and t.dim() == 0):  # 0-d: a Python number torch wrapped
                raise IsolationError(world.isolation_message(me.rank, owner, t, f"aten.{func.__name__}"))
        if me.inflight and not func.is_view:
            world.check_inflight(me, func, args, kwargs)

        out = func(*args, **kwargs)

        for t in _tensors_out(out):
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            if st._cdata not in owner_of:
                world.storage.adopt(st, me.rank, world.allocation_site())
        flops = op_flops(func, args, kwargs, out)
        if flops:
            me.clock.run_compute(me.rank, world.cost.compute_ticks(flops), flops, _phase(),
                                 me.labels[-1] if me.labels else "")
            me.flops += flops
        return out


# --------------------------------------------------------------------------------------------------------------
# The world: the ranks, the baton, matching.


class _RankState:
    def __init__(self, rank: int):
        self.rank = rank
        self.status = "ready"  # ready | running | blocked | done
        self.waiting: Work | None = None
        self.wait_site = ""
        self.go = threading.Lock()
        self.go.acquire()  # held: the rank's thread blocks on it until the baton is handed over
        self.thread: threading.Thread | None = None
        self.clock = RankClock()
        self.seq: dict[int, int] = {}  # group id -> number of collectives this rank has called on it
        self.labels: list[str] = []  # active record_function names
        self.untracked = False  # the runtime's own tensor work, invisible to the ledger and the isolation check
        self.inflight: list = []  # (storage key, lo, hi, read_ok, work, what, tensor)
        self.unwaited: list[Work] = []
        self.rng = None
        self.result = None
        self.flops = 0
        self.last_site = ""


class World:
    """All the state of one run. Nothing is global, so runs are independent and repeatable."""

    def __init__(self, world_size: int, cost: CostModel, seed: int, timeout: float, library_files=(),
                 harness_files=()):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.size, self.cost, self.seed, self.timeout = world_size, cost, seed, timeout
        self.ranks = [_RankState(r) for r in range(world_size)]
        self.ledgers = [Ledger(r, (lambda s=s: s.clock.compute)) for r, s in enumerate(self.ranks)]
        self.storage = StorageTracker(self.ledgers)
        self.sites = SiteFinder(library_files, harness_files)
        self.WORLD = ProcessGroup(self, 0, tuple(range(world_size)))
        # new_group is itself a collective of every rank; it is matched on its own, so that "call #k on WORLD"
        # counts only the collectives the learner wrote.
        self.GROUP_MAKER = ProcessGroup(self, -1, tuple(range(world_size)))
        self.groups = [self.WORLD]
        self.open: dict[tuple[int, int], _Collective] = {}
        self.sends: list[_P2P] = []
        self.recvs: list[_P2P] = []
        self.warnings: list[str] = []
        self.aborted = False
        self.error: BaseException | None = None
        self.failed_rank: int | None = None
        self.running = 0
        self.turn_started = time.monotonic()  # when the running rank got the baton (for the time limit)
        self._mutex = threading.Lock()
        self._done = threading.Lock()
        self._done.acquire()
        self._done_signalled = False
        self._local = threading.local()

    # ---- small helpers

    def rank_state(self, rank: int) -> _RankState:
        return self.ranks[rank]

    def current_rank(self) -> int:
        return getattr(self._local, "rank", self.running)

    def site(self) -> str:
        return self.sites.here()

    def allocation_site(self) -> str:
        site = self.sites.here()
        node = torch._C._current_autograd_node()
        return f"{site}  [backward: {node.name()}]" if node is not None else site

    @contextlib.contextmanager
    def untracked(self, me):
        """The runtime's own tensor work (moving data, saving RNG state): off the ledger, outside the isolation
        check, and without paying for the dispatch mode on every op."""
        me.untracked = True
        try:
            with _disable_current_modes():
                yield
        finally:
            me.untracked = False

    def isolation_message(self, rank: int, owner, t: torch.Tensor, what: str) -> str:
        where = self.sites.here()
        if owner is None:
            return (f"rank {rank} used a {_desc(t)} tensor that lives on no rank, in {what} at {where}. "
                    f"It was made outside the simulated ranks (a global? a module-level constant? a default "
                    f"argument?). Create it inside the rank's function, or pass it in through sim.run(args=...).")
        return (f"rank {rank} used a {_desc(t)} tensor that lives on rank {owner}, in {what} at {where}. "
                f"Each rank has its own memory: data moves between ranks only by communication "
                f"(send/recv or a collective).")

    # ---- the baton

    def _next_runnable(self, after: int) -> _RankState | None:
        for i in range(1, self.size + 1):
            r = self.ranks[(after + i) % self.size]
            if r.status == "ready" or (r.status == "blocked" and r.waiting._done):
                return r
        return None

    def yield_baton(self, me: _RankState, block_on: Work | None = None) -> None:
        """Hand the baton to the next rank that can run, in rank order after `me`; return when it is `me`'s
        turn again (at once, if nobody else can run). With `block_on`, `me` cannot run until that op is done."""
        if block_on is not None and not block_on._done:
            me.status, me.waiting = "blocked", block_on
        elif me.status != "done":
            me.status = "ready"
        with self._mutex:
            if self.aborted:
                raise _Abort
            nxt = self._next_runnable(me.rank)
            if nxt is None:
                if all(r.status == "done" for r in self.ranks):
                    self._finish_locked()
                    return
                self._fail_locked(self._stuck_error())
                raise _Abort
            self.running, self.turn_started = nxt.rank, time.monotonic()
            if nxt is me:
                me.status, me.waiting = "running", None
                return
            nxt.status, nxt.waiting = "running", None
            if me.status != "done":
                with self.untracked(me):
                    me.rng = torch.get_rng_state()
            nxt.go.release()
        if me.status == "done":
            return
        me.go.acquire()
        if self.aborted:
            raise _Abort
        with self.untracked(me):
            torch.set_rng_state(me.rng)

    def _finish_locked(self) -> None:
        dangling = [p.describe() for p in self.sends + self.recvs]
        dangling += [f"{c.where()}, which ranks {sorted(c.calls)} entered at "
                     f"{'; '.join(x.site for x in c.calls.values())}, but ranks "
                     f"{[r for r in c.group.ranks if r not in c.calls]} never did" for c in self.open.values()]
        if dangling:
            self.error = UnmatchedError(
                "every rank returned, but some communication was never matched:\n  - " + "\n  - ".join(dangling))
        self._signal_done()

    def _fail_locked(self, error: BaseException, rank: int | None = None) -> None:
        if self.error is None:
            self.error, self.failed_rank = error, rank
        self.aborted = True
        me = self.current_rank()
        for r in self.ranks:
            if r.rank != me and r.go.locked():
                r.go.release()  # wake it: it sees `aborted` and unwinds
        self._signal_done()

    def _signal_done(self) -> None:
        if not self._done_signalled:
            self._done_signalled = True
            self._done.release()

    # ---- what a stuck world looks like

    def _stuck_error(self) -> SimError:
        mismatch = self._group_mismatch()
        if mismatch:
            return CollectiveMismatchError(mismatch)
        lines, hints = [], []
        for r in self.ranks:
            if r.status == "done":
                last = f" (its last communication: {r.last_site})" if r.last_site else ""
                lines.append(f"rank {r.rank}: has returned{last}")
            else:
                waited_elsewhere = r.wait_site and r.wait_site != r.waiting.site
                lines.append(f"rank {r.rank}: waits in {r.waiting._describe()}"
                             + (f" (blocked in wait() at {r.wait_site})" if waited_elsewhere else ""))
        for a in self.ranks:
            for b in self.ranks:
                pa, pb = self._blocked_p2p(a), self._blocked_p2p(b)
                if a.rank < b.rank and pa and pb and pa.kind == pb.kind == "send" \
                        and pa.peer == b.rank and pb.peer == a.rank:
                    hints.append(f"ranks {a.rank} and {b.rank} both send first: a blocking send waits for the "
                                 f"matching recv, so one side must receive first (or use isend/irecv, "
                                 f"or batch_isend_irecv).")
        returned = [r.rank for r in self.ranks if r.status == "done"]
        if returned:
            hints.append(f"rank(s) {returned} returned while others still wait for them: did a rank skip a "
                         f"send, recv or collective that its partners make?")
        return DeadlockError("every rank that has not returned is blocked, so none can ever proceed:\n  "
                             + "\n  ".join(lines) + ("\n" + "\n".join(hints) if hints else ""))

    def _blocked_p2p(self, r: _RankState) -> _P2P | None:
        if r.status != "blocked":
            return None
        return next((p for p in self.sends + self.recvs if p.work is r.waiting), None)

    def _blocked_collective(self, r: _RankState) -> _Collective | None:
        if r.status != "blocked":
            return None
        return next((c for c in self.open.values() if any(x.work is r.waiting for x in c.calls.values())), None)

    def _group_mismatch(self) -> str | None:
        """Ranks stuck in two different collectives, each waiting for a rank that sits in the other."""
        for a in self.ranks:
            ca = self._blocked_collective(a)
            if ca is None:
                continue
            for m in ca.group.ranks:
                if m in ca.calls:
                    continue
                cb = self._blocked_collective(self.ranks[m])
                if cb is not None and cb is not ca:
                    return (f"rank {a.rank} waits in {ca.where()} at {ca.calls[a.rank].site}, while rank {m} "
                            f"waits in {cb.where()} at {cb.calls[m].site}. The ranks of a group must make the same "
                            f"collective calls, on the same group, in the same order; these two can never meet.")
        return None

    # ---- async bookkeeping

    def _mark_inflight(self, me: _RankState, work: Work, reads, writes, what: str) -> None:
        # The entry holds the tensor, as a real Work does until wait(): its memory cannot be freed and reused
        # (by an unrelated tensor that would then look "in flight") while the op may still be using it.
        for t in reads:
            me.inflight.append((*_span(t), True, work, what, t))
        for t in writes:
            me.inflight.append((*_span(t), False, work, what, t))
        me.unwaited.append(work)

    def check_inflight(self, me: _RankState, func, args, kwargs) -> None:
        written = {id(t) for t in _written_args(func, args, kwargs)}
        for t in _tensors_in(args, kwargs):
            self._check_access(me, t, id(t) in written, f"aten.{func.__name__}")

    def _check_access(self, me: _RankState, t: torch.Tensor, writes: bool, what: str) -> None:
        key, lo, hi = _span(t)
        for k, a, b, read_ok, work, opname, _ in me.inflight:
            if k == key and lo < b and a < hi and (writes or not read_ok):
                verb = "wrote" if writes else "read"
                raise InFlightError(
                    f"rank {me.rank} {verb} a {_desc(t)} tensor in {what} at {self.sites.here()} while its "
                    f"async {opname} (issued at {work.site}) was still in flight. Call work.wait() on that "
                    f"handle first: until then the {'data being sent' if read_ok else 'result'} is not yours "
                    f"to {'change' if read_ok else 'use'}.")

    def wait(self, me: _RankState, work: Work) -> None:
        if work._rank != me.rank:
            raise IsolationError(f"rank {me.rank} called wait() on a handle that belongs to rank {work._rank}")
        if not work._done:
            me.wait_site = self.site()
            try:
                self.yield_baton(me, block_on=work)
            finally:
                me.wait_site = ""
        me.clock.compute = max(me.clock.compute, work._end)
        work._waited = True
        me.inflight = [x for x in me.inflight if x[4] is not work]
        if work in me.unwaited:
            me.unwaited.remove(work)

    # ---- collectives

    def collective(self, me: _RankState, call: _Call, group, async_op: bool):
        group = self.check_group(me, group, call.name)
        for t in call.reads + call.writes:
            self.check_owned(me, t, call.name)
        if me.inflight:
            for t in call.reads:
                self._check_access(me, t, False, call.name)
            for t in call.writes:
                self._check_access(me, t, True, call.name)
        seq = me.seq.get(group.id, 0)
        me.seq[group.id] = seq + 1
        call.rank, call.issued, call.site = me.rank, me.clock.compute, self.site()
        call.phase = _phase()
        me.last_site = call.site
        coll = self.open.setdefault((group.id, seq), _Collective(call.name, group, seq))
        if coll.calls:
            self._check_signature(coll, call)
        work = Work(self, me.rank, call.name, call.site)
        work._describe = lambda: (f"{coll.where()} at {call.site}: ranks {sorted(coll.calls)} have arrived, "
                                  f"waiting for ranks {[r for r in group.ranks if r not in coll.calls]}")
        call.work = work
        coll.calls[me.rank] = call
        if async_op:
            self._mark_inflight(me, work, call.reads, call.writes, call.name)
        if len(coll.calls) == len(group.ranks):
            del self.open[(group.id, seq)]
            self._complete(coll)
        if async_op:
            self.yield_baton(me)
            return work
        self.wait(me, work)
        return None

    def _check_signature(self, coll: _Collective, call: _Call) -> None:
        first = next(iter(coll.calls.values()))
        if first.name != call.name:
            diff = f"rank {first.rank} called {first.name} at {first.site}, rank {call.rank} called {call.name} at {call.site}"
        else:
            keys = [k for k in first.signature if first.signature[k] != call.signature.get(k)]
            if not keys:
                return
            diff = "; ".join(f"rank {first.rank} passed {k}={first.signature[k]} (at {first.site}), "
                             f"rank {call.rank} passed {k}={call.signature[k]} (at {call.site})" for k in keys)
        error = CollectiveMismatchError(
            f"ranks met in {coll.where()} with different arguments: {diff}. Every rank of the group must make the "
            f"same collective call with tensors of the same shape and dtype (torch.distributed would hang or "
            f"silently compute garbage here).")
        with self._mutex:
            self._fail_locked(error)
        raise _Abort

    def _complete(self, coll: _Collective) -> None:
        calls = [coll.calls[r] for r in coll.group.ranks]
        coll.calls.clear()  # waiting ranks hold `coll` until they resume: it must not keep the others' tensors alive
        with self.untracked(self.ranks[self.current_rank()]):
            calls[0].exchange(calls)
        n = len(calls)
        if coll.name == "new_group":  # bookkeeping, not traffic: it takes no simulated time
            for c in calls:
                c.work._finish(self.ranks[c.rank].clock.compute)
            return
        start = max(max(c.issued, self.ranks[c.rank].clock.comm) for c in calls)
        end = start + self.cost.comm_ticks(coll.name, calls[0].nbytes, n)
        wire = self.cost.wire_bytes(coll.name, calls[0].nbytes, n)
        for c in calls:
            clock = self.ranks[c.rank].clock
            clock.comm = end
            clock.events.append(Event(c.rank, "comm", coll.name, start, end, nbytes=c.nbytes, wire_bytes=wire,
                                      phase=c.phase, peers=coll.group.ranks, site=c.site,
                                      label=self.ranks[c.rank].labels[-1] if self.ranks[c.rank].labels else ""))
            c.work._finish(end)

    def check_group(self, me: _RankState, group, what: str) -> ProcessGroup:
        if group is None:
            return self.WORLD
        if group is NON_GROUP_MEMBER:
            raise ValueError(f"rank {me.rank} called {what} with GroupMember.NON_GROUP_MEMBER: new_group returned "
                             f"that because rank {me.rank} is not in the group. Call {what} only on ranks of the group.")
        if not isinstance(group, ProcessGroup) or group._world is not self:
            raise ValueError(f"rank {me.rank} passed group={group!r} to {what}: use dist.group.WORLD or a group "
                             f"made by this run's dist.new_group")
        if me.rank not in group.ranks:
            raise ValueError(f"rank {me.rank} called {what} on {group}, which it is not a member of "
                             f"(torch.distributed would silently skip the call on rank {me.rank})")
        return group

    def check_owned(self, me: _RankState, t, what: str) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} expects a torch.Tensor, got {type(t).__name__}")
        owner = self.storage.owner_of(t.untyped_storage())
        if owner != me.rank:
            raise IsolationError(self.isolation_message(me.rank, owner, t, what))

    # ---- point to point

    def post_p2p(self, me: _RankState, kind: str, tensor, peer, group, tag: int) -> Work:
        group = self.check_group(me, group, kind)
        self.check_owned(me, tensor, kind)
        if peer is not None:
            if not isinstance(peer, int) or not 0 <= peer < self.size:
                raise ValueError(f"rank {me.rank}: {kind} to/from rank {peer!r}, but ranks are 0..{self.size - 1}")
            if peer == me.rank:
                raise ValueError(f"rank {me.rank} tried to {kind} to/from itself; a rank already has its own data")
            if peer not in group.ranks:
                raise ValueError(f"rank {me.rank}: {kind} peer {peer} is not in {group}")
        if me.inflight:
            self._check_access(me, tensor, kind == "recv", kind)
        site = self.site()
        me.last_site = site
        work = Work(self, me.rank, kind, site)
        p = _P2P(kind, me.rank, peer, tag, group, tensor, me.clock.compute, site, work, _phase())
        work._describe = p.describe
        if kind == "send":
            match = next((r for r in self.recvs if r.accepts(p)), None)
            pair = (p, match)
        else:
            match = next((s for s in self.sends if p.accepts(s)), None)
            pair = (match, p)
        if match is None:
            (self.sends if kind == "send" else self.recvs).append(p)
        else:
            (self.recvs if kind == "send" else self.sends).remove(match)
            self._transfer(*pair)
        return work

    def _transfer(self, send: _P2P, recv: _P2P) -> None:
        if send.tensor.shape != recv.tensor.shape or send.tensor.dtype != recv.tensor.dtype:
            error = P2PMismatchError(
                f"rank {send.rank} sent a {_desc(send.tensor)} tensor (at {send.site}) but rank {recv.rank} "
                f"receives into a {_desc(recv.tensor)} tensor (at {recv.site}). Allocate the receive buffer with "
                f"the sender's shape and dtype.")
            with self._mutex:
                self._fail_locked(error)
            raise _Abort
        with self.untracked(self.ranks[self.current_rank()]):
            recv.tensor.data.copy_(send.tensor)
        a, b = self.ranks[send.rank].clock, self.ranks[recv.rank].clock
        start = max(send.issued, recv.issued, a.comm, b.comm)
        nbytes = send.tensor.numel() * send.tensor.element_size()
        end = start + self.cost.comm_ticks("send", nbytes, 2)
        for p, clock in ((send, a), (recv, b)):
            clock.comm = end
            st = self.ranks[p.rank]
            clock.events.append(Event(p.rank, "comm", p.kind, start, end, nbytes=nbytes, wire_bytes=nbytes,
                                      phase=p.phase,
                                      peers=(send.rank, recv.rank), site=p.site,
                                      label=st.labels[-1] if st.labels else ""))
            p.work._finish(end)
        recv.work._source = send.rank

    # ---- running a function on every rank

    def _place(self, me: _RankState, value, memo: dict):
        """Copy the harness's tensors onto this rank: they count on its ledger, and belong to it."""
        if isinstance(value, torch.Tensor):
            if id(value) not in memo:
                with self.untracked(me):
                    copy = value.detach().clone()
                    if isinstance(value, torch.nn.Parameter):
                        copy = torch.nn.Parameter(copy, requires_grad=value.requires_grad)
                    elif value.requires_grad:
                        copy.requires_grad_(True)
                self.storage.adopt(copy.untyped_storage(), me.rank, "input placed on the rank by sim.run")
                memo[id(value)] = copy
            return memo[id(value)]
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(self._place(me, v, memo) for v in value))
        if isinstance(value, (list, tuple)):
            return type(value)(self._place(me, v, memo) for v in value)
        if isinstance(value, dict):
            return type(value)((k, self._place(me, v, memo)) for k, v in value.items())
        return value

    def _rank_main(self, me: _RankState, fn, args) -> None:
        self._local.rank = me.rank
        _active.world = self
        me.go.acquire()
        if self.aborted:
            return
        try:
            # Ranks take turns, so a rank gains nothing from intra-op threads, and OpenMP teams started from
            # many threads fight over the cores (measured: 3x slower on 2 cores).
            torch.set_num_threads(1)
            torch.set_rng_state(me.rng)
            with _RankMode(self, me):
                placed = self._place(me, tuple(args), {})
                me.result = fn(SimDist(self, me.rank), *placed)
                self.ledgers[me.rank].close()  # what the rank holds as it returns, its inputs included
                del placed
        except _Abort:
            return
        except BaseException as exc:  # the learner's error: stop everybody, re-raise it in the caller
            with self._mutex:
                self._fail_locked(exc, me.rank)
            return
        for w in me.unwaited:
            if w._done:
                self.warnings.append(f"rank {me.rank} returned without calling wait() on its {w.what} issued at "
                                     f"{w.site}")
        me.status = "done"
        try:
            self.yield_baton(me)
        except _Abort:
            pass

    def run(self, fn, args, rank_args) -> SimResult:
        if getattr(_active, "world", None) is not None:
            raise RuntimeError("sim.run cannot be called from inside a simulated rank")
        main_rng, main_threads = torch.get_rng_state(), torch.get_num_threads()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # frees by reference counting only, so the ledger is the same on every run
        try:
            for r in self.ranks:
                torch.manual_seed((self.seed * 65_537 + r.rank) % (2**63))
                r.rng = torch.get_rng_state()
                per_rank = tuple(rank_args[r.rank]) if rank_args is not None else ()
                r.thread = threading.Thread(target=self._rank_main, args=(r, fn, (*args, *per_rank)),
                                            name=f"sim-rank-{r.rank}", daemon=True)
                r.thread.start()
            self.running, self.turn_started = 0, time.monotonic()
            self.ranks[0].status = "running"
            self.ranks[0].go.release()
            self._supervise()
        finally:
            torch.set_rng_state(main_rng)
            torch.set_num_threads(main_threads)
            if gc_was_enabled:
                gc.enable()
        if self.error is not None:
            error = self.error
            if self.failed_rank is not None:
                _note(error, f"(raised on rank {self.failed_rank} of {self.size}; the other ranks were stopped)")
                try:
                    error.sim_rank = self.failed_rank
                except AttributeError:
                    pass
            raise error
        for ledger in self.ledgers:
            ledger.close()
        events = sorted((e for r in self.ranks for e in r.clock.events),
                        key=lambda e: (e.start, e.rank, e.stream, e.end))
        makespan = max([max(r.clock.compute, r.clock.comm) for r in self.ranks] + [0])
        return SimResult(self.size, [r.result for r in self.ranks], self.ledgers, events, makespan, self.cost,
                         [r.flops for r in self.ranks], self.warnings)

    def _supervise(self) -> None:
        """Wait for the ranks to finish, fail or run out of time; leave no thread behind.

        A rank may hold the baton (compute without communicating) for `timeout` seconds of wall time; the whole
        run may take ten times that (ranks that keep communicating but never finish: a livelock)."""
        run_deadline = time.monotonic() + 10 * self.timeout
        try:
            while not self._done.acquire(timeout=0.25):
                now = time.monotonic()
                if now - self.turn_started <= self.timeout and now <= run_deadline:
                    continue
                with self._mutex:
                    if self._done_signalled:
                        continue
                    culprit = self.ranks[self.running]
                    where = describe_frame(self.sites.user_frame(_current_frame(culprit.thread)))
                    if now - self.turn_started > self.timeout:
                        error = TimeLimitError(
                            f"rank {culprit.rank} ran for more than {self.timeout:g} s of wall time without "
                            f"communicating or returning; it was at {where}. An endless loop? (Pass a larger "
                            f"timeout to sim.run if the work is really that long.)")
                    else:
                        error = TimeLimitError(
                            f"the ranks kept communicating for more than {10 * self.timeout:g} s of wall time "
                            f"without finishing (a livelock? a rank polling is_completed() forever?); rank "
                            f"{culprit.rank} was at {where}.")
                    self._fail_locked(error, None)
                    _async_raise(culprit.thread)
        except BaseException:  # KeyboardInterrupt in a notebook: stop the ranks before leaving
            with self._mutex:
                self._fail_locked(_Abort())
                _async_raise(self.ranks[self.running].thread)
            raise
        finally:
            stop = time.monotonic() + 5.0
            for r in self.ranks:
                r.thread.join(timeout=max(0.0, stop - time.monotonic()))
            stuck = [r.rank for r in self.ranks if r.thread.is_alive()]
            if stuck and self.error is not None:
                _note(self.error, f"(the threads of ranks {stuck} are still busy in C code and were abandoned)")


def _phase() -> str:
    """'backward' while autograd's engine is running this thread's backward pass, else 'forward'."""
    return "backward" if torch._C._current_autograd_node() is not None else "forward"


_active = threading.local()


def _current_frame(thread: threading.Thread):
    import sys

    return sys._current_frames().get(thread.ident)


def _async_raise(thread: threading.Thread) -> None:
    """Raise _Abort inside another thread at its next Python bytecode: how a runaway loop is stopped."""
    if thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Abort))


def _note(error: BaseException, text: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(text)


# --------------------------------------------------------------------------------------------------------------
# `dist`: the torch.distributed API as one rank sees it.


class _GroupNamespace:
    def __init__(self, world_group: ProcessGroup):
        self.WORLD = world_group
        self.NON_GROUP_MEMBER = NON_GROUP_MEMBER


class SimDist:
    """What `fn` receives as `dist`. Same names, argument order, in-place semantics and return values as
    torch.distributed, so `fn(torch.distributed, ...)` in a real process group computes the same thing."""

    ReduceOp = ReduceOp
    P2POp = P2POp

    def __init__(self, world: World, rank: int):
        self._world, self._me = world, world.ranks[rank]
        self.group = _GroupNamespace(world.WORLD)
        self.GroupMember = self.group

    # ---- who am I

    def get_rank(self, group=None) -> int:
        group = self._world.WORLD if group is None else group
        return group.ranks.index(self._me.rank) if isinstance(group, ProcessGroup) and self._me.rank in group.ranks else -1

    def get_world_size(self, group=None) -> int:
        group = self._world.WORLD if group is None else group
        return len(group.ranks) if isinstance(group, ProcessGroup) and self._me.rank in group.ranks else -1

    def get_global_rank(self, group, group_rank: int) -> int:
        return group.ranks[group_rank]

    def get_group_rank(self, group, global_rank: int) -> int:
        return group.ranks.index(global_rank)

    def get_process_group_ranks(self, group) -> list[int]:
        return list(group.ranks)

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def get_backend(self, group=None) -> str:
        return "sim"

    def new_group(self, ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
                  group_desc=None):
        """Every rank must call it, with the same ranks, in the same order (as in torch.distributed).
        Members get the group; the other ranks get GroupMember.NON_GROUP_MEMBER."""
        world = self._world
        members = tuple(sorted(set(range(world.size) if ranks is None else ranks)))
        if not members or members[0] < 0 or members[-1] >= world.size:
            raise ValueError(f"new_group({ranks!r}): ranks must be within 0..{world.size - 1}")

        def make_group(calls):
            group = ProcessGroup(world, len(world.groups), members)
            world.groups.append(group)
            for c in calls:
                c.group_made = group

        call = _Call("new_group", make_group, {"ranks": list(members)})
        world.collective(self._me, call, world.GROUP_MAKER, async_op=False)
        return call.group_made if self._me.rank in members else NON_GROUP_MEMBER

    # ---- point to point

    def _peer(self, peer, group, group_peer):
        if group_peer is not None:
            return (group or self._world.WORLD).ranks[group_peer]
        return peer

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None) -> Work:
        work = self._world.post_p2p(self._me, "send", tensor, self._peer(dst, group, group_dst), group, tag)
        self._world._mark_inflight(self._me, work, [tensor], [], "isend")
        self._world.yield_baton(self._me)
        return work

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None) -> Work:
        work = self._world.post_p2p(self._me, "recv", tensor, self._peer(src, group, group_src), group, tag)
        self._world._mark_inflight(self._me, work, [], [tensor], "irecv")
        self._world.yield_baton(self._me)
        return work

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
        """Blocks until the matching recv is posted and the data has arrived (a rendezvous)."""
        work = self._world.post_p2p(self._me, "send", tensor, self._peer(dst, group, group_dst), group, tag)
        self._world.wait(self._me, work)

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None) -> int:
        """Blocks until a matching send arrives; returns the sender's rank (src=None receives from anyone)."""
        work = self._world.post_p2p(self._me, "recv", tensor, self._peer(src, group, group_src), group, tag)
        self._world.wait(self._me, work)
        return work._source

    def batch_isend_irecv(self, p2p_op_list) -> list[Work]:
        """Post every send and recv of the list, then return their handles (no ordering deadlock among them)."""
        works = []
        for p in p2p_op_list:
            kind = getattr(p.op, "__name__", "")
            if kind not in ("isend", "irecv"):
                raise ValueError(f"P2POp.op must be dist.isend or dist.irecv, got {p.op!r}")
            peer = self._peer(p.peer, p.group, p.group_peer)
            work = self._world.post_p2p(self._me, kind[1:], p.tensor, peer, p.group, p.tag)
            reads, writes = ([p.tensor], []) if kind == "isend" else ([], [p.tensor])
            self._world._mark_inflight(self._me, work, reads, writes, kind)
            works.append(work)
        self._world.yield_baton(self._me)
        return works

    # ---- collectives

    def _size(self, group) -> int:
        return len((group or self._world.WORLD).ranks) if isinstance(group or self._world.WORLD, ProcessGroup) else 0

    def all_reduce(self, tensor, op=ReduceOp.SUM, group=None, async_op=False):
        op = _reduce_op(op)
        call = _Call("all_reduce", _all_reduce, {"tensor": _desc(tensor), "op": op.name},
                     reads=[tensor], writes=[tensor], nbytes=_nbytes(tensor), tensor=tensor, op=op)
        return self._world.collective(self._me, call, group, async_op)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        n = self._size(group)
        if len(tensor_list) != n or any(t.shape != tensor.shape or t.dtype != tensor.dtype for t in tensor_list):
            raise ValueError(f"all_gather on rank {self._me.rank}: tensor_list must hold {n} tensors shaped like "
                             f"the input {_desc(tensor)}, got {[_desc(t) for t in tensor_list]}")
        call = _Call("all_gather", _all_gather, {"tensor": _desc(tensor)}, reads=[tensor], writes=list(tensor_list),
                     nbytes=n * _nbytes(tensor), tensor=tensor, tensor_list=tensor_list)
        return self._world.collective(self._me, call, group, async_op)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        n = self._size(group)
        if output_tensor.numel() != n * input_tensor.numel() or output_tensor.dtype != input_tensor.dtype:
            raise ValueError(f"all_gather_into_tensor on rank {self._me.rank}: the output must hold {n} x the input "
                             f"{_desc(input_tensor)} of the same dtype, got {_desc(output_tensor)}")
        call = _Call("all_gather_into_tensor", _all_gather_into_tensor,
                     {"input": _desc(input_tensor), "output": _desc(output_tensor)},
                     reads=[input_tensor], writes=[output_tensor], nbytes=_nbytes(output_tensor),
                     input=input_tensor, output=output_tensor)
        return self._world.collective(self._me, call, group, async_op)

    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, group=None, async_op=False):
        n, op = self._size(group), _reduce_op(op)
        if input.numel() != n * output.numel() or output.dtype != input.dtype:
            raise ValueError(f"reduce_scatter_tensor on rank {self._me.rank}: the input must hold {n} x the output "
                             f"{_desc(output)} of the same dtype, got {_desc(input)}")
        call = _Call("reduce_scatter_tensor", _reduce_scatter_tensor,
                     {"input": _desc(input), "output": _desc(output), "op": op.name},
                     reads=[input], writes=[output], nbytes=_nbytes(input), input=input, output=output, op=op)
        return self._world.collective(self._me, call, group, async_op)

    def broadcast(self, tensor, src=None, group=None, async_op=False, group_src=None):
        src = self._peer(src, group, group_src)
        g = group or self._world.WORLD
        if src is None or (isinstance(g, ProcessGroup) and src not in g.ranks):
            raise ValueError(f"broadcast on rank {self._me.rank}: src={src!r} must be a (global) rank of {g}")
        is_root = src == self._me.rank
        call = _Call("broadcast", _broadcast, {"tensor": _desc(tensor), "src": src},
                     reads=[tensor] if is_root else [], writes=[] if is_root else [tensor],
                     nbytes=_nbytes(tensor), tensor=tensor, is_root=is_root)
        return self._world.collective(self._me, call, group, async_op)

    def barrier(self, group=None, async_op=False, device_ids=None):
        return self._world.collective(self._me, _Call("barrier", _nothing, {}), group, async_op)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# --------------------------------------------------------------------------------------------------------------
# The result of a run, and the entry point.


@dataclass
class SimResult:
    """What a run leaves behind: each rank's return value, memory ledger and events, and the makespan."""

    world_size: int
    results: list
    ledgers: list[Ledger]
    events: list[Event]
    makespan: int
    cost: CostModel
    flops: list[int]
    warnings: list[str]

    @property
    def peak_bytes(self) -> list[int]:
        return [ledger.peak for ledger in self.ledgers]

    def events_of(self, rank: int | None = None, stream: str | None = None, kind: str | None = None) -> list[Event]:
        return [e for e in self.events if (rank is None or e.rank == rank) and (stream is None or e.stream == stream)
                and (kind is None or e.kind == kind)]

    def busy_ticks(self, rank: int, stream: str = "compute") -> int:
        return sum(e.ticks for e in self.events_of(rank, stream))

    def idle_fraction(self, rank: int | None = None) -> float:
        """Share of the makespan the compute stream sat idle (one rank, or averaged over all): the bubble."""
        if self.makespan == 0:
            return 0.0
        ranks = range(self.world_size) if rank is None else [rank]
        idle = sum(self.makespan - self.busy_ticks(r) for r in ranks)
        return idle / (self.makespan * len(ranks))

    def summary(self) -> str:
        rows = [f"{'rank':>4}  {'peak bytes':>12}  {'compute ticks':>13}  {'comm ticks':>10}"]
        for r in range(self.world_size):
            rows.append(f"{r:>4}  {self.ledgers[r].peak:>12,}  {self.busy_ticks(r):>13,}  "
                        f"{self.busy_ticks(r, 'comm'):>10,}")
        rows.append(f"makespan: {self.makespan:,} ticks")
        return "\n".join(rows)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "makespan": self.makespan, "peak_bytes": self.peak_bytes,
                "flops": self.flops, "cost": dataclasses.asdict(self.cost),
                "events": [e.to_dict() for e in self.events], "ledgers": [l.to_dict() for l in self.ledgers],
                "warnings": list(self.warnings)}


def current_ledger() -> Ledger | None:
    """The memory ledger of the simulated rank calling this (None outside a rank): for a harness that wants to
    know how many bytes a rank holds at some moment, say between a forward and a backward."""
    world = getattr(_active, "world", None)
    return None if world is None else world.ledgers[world.current_rank()]


def run(fn, world_size: int, *, args=(), rank_args=None, cost: CostModel | None = None, seed: int = 0,
        timeout: float = 60.0, library_files=(), harness_files=()) -> SimResult:
    """Run `fn(dist, *args, *rank_args[rank])` on `world_size` simulated ranks and return a SimResult.

    args:      the same for every rank; each rank gets its own copy of every tensor in it (which counts on its ledger).
    rank_args: a sequence with one tuple of extra arguments per rank (say, each rank's shard of the batch).
    cost:      the CostModel of the simulated machine.
    seed:      seeds each rank's random-number generator (rank r gets its own stream).
    timeout:   seconds of wall time a rank may compute without communicating before it is stopped (an endless
               loop); the whole run may take ten times that.
    library_files: source files whose lines are not the learner's (allocations are charged to their caller).
    harness_files: source files of the code that calls the learner's (a grader): their lines are marked "[harness]".

    An exception in any rank stops the others and is re-raised here, with a note naming the rank.
    """
    if rank_args is not None and len(rank_args) != world_size:
        raise ValueError(f"rank_args needs one entry per rank: {world_size}, got {len(rank_args)}")
    world = World(world_size, cost or CostModel(), seed, timeout, library_files, harness_files)
    return world.run(fn, tuple(args), rank_args)
