"""The vocabulary of the simulated runtime: its errors, and the torch.distributed objects that `dist` hands out.

The errors each name the ranks involved and the learner's lines. `ReduceOp`, `ProcessGroup`, `P2POp` and `Work`
mirror their torch.distributed namesakes. Nothing here runs a rank: the world of a run is in world.py.
"""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .world import World


# --------------------------------------------------------------------------------------------------------------
# Errors: each names the ranks involved and the learner's lines.


class SimError(Exception):
    """Base class of the simulator's own errors."""


class DeadlockError(SimError):
    """Every rank that has not returned is blocked waiting for another: none can ever proceed."""


class CollectiveTimeoutError(DeadlockError):
    """A communication call did not complete within its group's timeout (sim.run's collective_timeout, the mirror
    of init_process_group's timeout=), as NCCL's watchdog reports it: either the ranks parted and it can never
    complete (a deadlock), or a partner arrived later than the timeout allows (watchdog.py)."""


class CollectiveMismatchError(SimError):
    """Ranks met in one collective with different ops, shapes, dtypes, reduce ops, roots or groups."""


class P2PMismatchError(SimError):
    """A send and the recv it matched disagree on shape or dtype."""


class IsolationError(SimError):
    """An op on rank r used a tensor that lives on rank s (or on no rank)."""


class InFlightError(SimError):
    """A tensor was touched while an async op on it had not been waited for."""


class WorkError(SimError):
    """A work handle was used in a way a real backend hangs on: a point-to-point handle (isend, irecv,
    batch_isend_irecv) waited for a second time (gloo's second wait() never returns)."""


class UnwaitedWorkError(WorkError):
    """A rank returned without calling wait() on a handle its isend, irecv, batch_isend_irecv or async collective
    returned. On real processes such a message can be lost (the partner hangs) or read half done."""


class NonContiguousError(SimError, ValueError):
    """A non-contiguous tensor (a column, a strided slice, a transpose) was handed to a collective or a send/recv.
    gloo runs all_reduce and broadcast on the raw memory (wrong elements), refuses it in send/recv and the
    all-to-alls, and copies it in the gathers; NCCL refuses it in every collective, so the simulator does too."""


class RankThreadError(SimError):
    """A rank's code started a thread or a process (allowed.py: the clock and the ledger watch one thread per
    rank), or `dist`, a work handle or the checkpoint disk was used outside the thread of the rank it belongs to
    (from another thread, or after its run had ended)."""


class ImportRefusedError(SimError, ImportError):
    """A rank's own line imported, while a run was on, a module outside the list of what a puzzle may import
    (modules.py). An ImportError, so code that falls back when a module is missing runs on."""


class UncostedOpError(SimError):
    """A rank ran an aten op that has no cost formula in the puzzles (op_costs.py): the clock and the FLOP count
    would have to guess its work, so it does not run (allowed.py states the policy). The message names the op, the
    learner's line and what to write instead."""


class OverlapError(SimError, ValueError):
    """An all-to-all whose output overlaps its input: gloo overwrites the input while it still sends it (measured:
    wrong values), so the output must be a buffer of its own."""


class AutogradWriteError(SimError, RuntimeError):
    """A collective would write, in place, into a tensor that requires grad while autograd records (or read from
    one): gloo copies through views of its own there, which autograd refuses with a RuntimeError."""


class HiddenMemoryError(SimError):
    """A rank turned a tensor into memory the ledger cannot see: a numpy array, a Python list, bytes (more than a
    few numbers at a time; see guards.py)."""


class TimeLimitError(SimError):
    """A rank ran past the time limit without communicating or returning."""


class UnmatchedError(SimError):
    """Every rank returned, but a send, recv or collective that one of them posted was never matched."""


class RankCrashed(BaseException):
    """The rank died at a failure a harness injected (filesystem.py): not the learner's mistake. Not an Exception,
    so `except Exception` does not catch it, as nothing in a process catches kill -9; a dead rank's later dist and
    disk calls raise it again."""


class _Abort(BaseException):
    """Raised inside a rank thread to unwind it when the run is stopped. Not an Exception, so `except Exception`
    in learner code does not swallow it. It says what happened, should a learner's code catch it and print it."""

    def __str__(self) -> str:
        return (str(self.args[0]) if self.args else
                "the simulator stopped this rank: its run had ended, or another rank failed, or a time limit passed "
                "(let this exception pass: a rank that catches it is stopped again at its next call)")


# --------------------------------------------------------------------------------------------------------------
# The vocabulary of torch.distributed: reduce ops, groups, P2POp, Work.


class ReduceOp(enum.Enum):
    """The reductions gloo runs. AVG and the bitwise ops take some dtypes only (see `check_reduce_dtype`)."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


_SUPPORTED_OPS = ", ".join(op.name for op in ReduceOp)


def _reduce_op(op) -> ReduceOp:
    """Our ReduceOp, from ours or from torch.distributed.ReduceOp.X. Anything else is refused as torch refuses it:
    a string or a number is a TypeError there too, and PREMUL_SUM is NCCL's alone."""
    if isinstance(op, ReduceOp):
        return op
    name = getattr(op, "name", None) or getattr(getattr(op, "op", None), "name", None)  # a torch RedOpType / ReduceOp
    if not isinstance(name, str) or isinstance(op, str):
        raise TypeError(f"op={op!r}: a reduce op is a member of dist.ReduceOp ({_SUPPORTED_OPS}), not a "
                        f"{type(op).__name__} (torch.distributed refuses it too)")
    try:
        return ReduceOp[name]
    except KeyError:
        raise ValueError(f"ReduceOp.{name} is not supported here (gloo rejects it: it is NCCL's alone); "
                         f"use one of {_SUPPORTED_OPS}") from None


def check_reduce_dtype(op: ReduceOp, t: torch.Tensor, what: str) -> None:
    """Refuse what torch.distributed refuses: bitwise ops on floats ("Cannot use ReduceOp.BAND with non-integral
    dtype"), and AVG on integers or bools (the average is not an integer: gloo raises "result type Float can't be
    cast to the desired output type")."""
    if op is ReduceOp.SUM:  # (the common case: every dtype may be summed)
        return
    exact = not (t.is_floating_point() or t.is_complex())
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and not exact:
        raise ValueError(f"{what} with ReduceOp.{op.name} on a {_desc(t)} tensor: bitwise reductions take integer "
                         f"or bool tensors only (torch.distributed raises here too)")
    if op is ReduceOp.AVG and exact:
        raise ValueError(f"{what} with ReduceOp.AVG on a {_desc(t)} tensor: the average of integers is not an "
                         f"integer, and torch.distributed refuses it. Reduce with SUM, then divide in a floating "
                         f"dtype (x.double() / world_size).")


# The world a process group or a work handle belongs to, kept here rather than on the object: a rank holds both,
# and an attribute would lead from them to the simulator's state (dist.py says why not).
_WORLDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def world_of(handle):
    """The world of a ProcessGroup or a Work (None for any other object, or one of another run that is gone)."""
    try:
        return _WORLDS.get(handle)
    except TypeError:  # not weakly referable: no handle of ours
        return None


class ProcessGroup:
    """A set of ranks that communicate together. `dist.group.WORLD` holds every rank; `dist.new_group(ranks)`
    makes sub-groups (say, the tensor-parallel and the data-parallel ranks of a 2-D layout)."""

    def __init__(self, world: World, gid: int, ranks: tuple[int, ...]):
        _WORLDS[self] = world  # (not an attribute: what a rank holds is a view without levers, dist.py)
        self.id, self.ranks = gid, ranks

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """The calling rank's position in this group (-1 if it is not a member), like ProcessGroup.rank()."""
        me = _WORLDS[self].current_rank()
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
    compute stream; until then the tensors it reads may not be written and the tensors it writes may not be used.
    Every handle must be waited for once before its rank returns (UnwaitedWorkError), and a point-to-point handle
    no more than once (WorkError): real backends lose or hang on the rest."""

    def __init__(self, world: World, rank: int, what: str, site: str):
        _WORLDS[self] = world
        self._rank, self.what, self.site = rank, what, site
        self._done = False
        self._end = 0
        self._waited = False
        self._wait_site = ""  # where the learner first waited for it
        self._source = None
        self._describe = lambda: what  # replaced by the op that owns this handle
        self._queued = None  # its place in the rank's communication queue until the op is on the clock (clock.py)

    def is_completed(self) -> bool:
        # Counts as a communication call: it passes the baton, so a polling loop lets the partners progress.
        # A send or recv handle says True only once waited for: gloo's do (measured: False until wait()).
        _WORLDS[self].poll(self)
        return self._waited if self.what in ("send", "recv") else self._done

    def wait(self, timeout=None) -> bool:
        _WORLDS[self].wait_handle(self)
        return True

    def source_rank(self) -> int | None:
        return self._source

    _source_rank = source_rank  # the name torch.distributed's own recv uses

    def _finish(self, end: int) -> None:
        """Mark the op done at tick `end`. Drop its description too: that closure holds the op's tensors and
        this handle, a reference cycle that would keep them on the ledger (sim.run turns the cycle collector off)."""
        self._done, self._end = True, end
        self._describe = lambda what=self.what: what
        self._queued = None

    def __repr__(self):
        return f"<Work {self.what} rank={self._rank} {'done' if self._done else 'pending'}>"


class Registry:
    """What stands behind each object a rank is handed (a dist, a work handle, a ledger's view): id(object) -> the
    simulator's own object, while the handed one lives (`hold` drops the entry when it dies). It is how an object
    a rank holds reaches the simulator's state without an attribute that leads there. An object, not a module-level
    dict: the tamper fingerprint holds the simulator's module-level dicts to their contents, and these change with
    every run."""

    __slots__ = ("of",)

    def __init__(self):
        self.of: dict = {}

    def hold(self, handed, behind) -> None:
        self.of[id(handed)] = behind
        weakref.finalize(handed, self.of.pop, id(handed), None)


_HANDLED = Registry()  # WorkHandle -> its Work


class WorkHandle:
    """What an async op hands the rank (`dist.isend`, `dist.all_reduce(..., async_op=True)`, ...): torch.distributed's
    Work, with `wait()`, `is_completed()` and `source_rank()`. A view without levers: the op's state (its place on
    the clock, its end, whether it is done, who waits for it) is the simulator's Work, found in this module's
    registry, so that no attribute of the handle leads to it."""

    __slots__ = ("__weakref__",)

    def __init__(self, work: Work):
        _HANDLED.hold(self, work)

    def wait(self, timeout=None) -> bool:
        return _HANDLED.of[id(self)].wait(timeout)

    def is_completed(self) -> bool:
        return _HANDLED.of[id(self)].is_completed()

    def source_rank(self) -> int | None:
        return _HANDLED.of[id(self)].source_rank()

    _source_rank = source_rank  # the name torch.distributed's own recv uses

    def __getattr__(self, name: str):  # (only for a name that is not found: the API's never reach here)
        raise AttributeError(f"a work handle has no attribute {name!r}: it offers wait(), is_completed() and "
                             f"source_rank(), as torch.distributed's Work does, and holds none of the simulator's "
                             f"state")

    def __repr__(self) -> str:
        return repr(_HANDLED.of[id(self)])


def handed(result):
    """What a dist call returns, as the rank gets it: each Work as its WorkHandle."""
    if type(result) is Work:
        return WorkHandle(result)
    if type(result) is list and result and type(result[0]) is Work:
        return [WorkHandle(w) for w in result]
    return result


class _Sig(tuple):
    """(dtype, shape) of a tensor a collective takes, what must agree across ranks: compared as a tuple, shown as
    _desc shows it (a call's signature is compared at every collective and shown only when ranks differ)."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"{str(self[0]).replace('torch.', '')}[{', '.join(map(str, self[1]))}]"

    __repr__ = __str__


def _sig(t: torch.Tensor) -> _Sig:
    return _Sig((t.dtype, t.shape))


def _desc(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}[{', '.join(map(str, t.shape))}]"
