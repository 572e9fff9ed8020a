"""What each collective does to the data: read this file to learn what an all-reduce is.

Every rank of a group calls the same collective with its own tensors. When the last of them arrives, the runtime
(matching.py) hands one function below the calls of every rank, in rank order, and the function moves the
data by plain tensor copies. Say three ranks hold a, b and c:

    all_reduce              [a]        [b]        [c]         ->  [a+b+c]    [a+b+c]    [a+b+c]
    all_gather              [a]        [b]        [c]         ->  [a,b,c]    [a,b,c]    [a,b,c]
    reduce_scatter_tensor   [a0 a1 a2] [b0 b1 b2] [c0 c1 c2]  ->  [a0+b0+c0] [a1+b1+c1] [a2+b2+c2]
    broadcast (from rank 0) [a]        [.]        [.]         ->  [a]        [a]        [a]
    all_to_all_single       [a0 a1 a2] [b0 b1 b2] [c0 c1 c2]  ->  [a0 b0 c0] [a1 b1 c1] [a2 b2 c2]

An all-to-all is a transpose across ranks: rank j ends with every rank's j-th chunk. Its chunks may differ in
size (a mixture of experts sends each expert the tokens routed to it): each rank says how many rows it sends to
each rank (input_split_sizes) and receives from each (output_split_sizes), and the two must agree pairwise.

An all-reduce is a reduce-scatter followed by an all-gather: that is how the ring algorithm of NCCL and gloo runs
it, and why it costs twice the traffic of either (clock.py has the costs).

Every collective reads all of its inputs before it writes any output (as gloo does), so an output may be (a
slice of) the rank's own input: the runtime hands these functions a copy of any input that overlaps an output
of the same rank (matching.py).

The records at the end are what the runtime matches: `_Call` (what one rank brought to a collective),
`_Collective` (one collective in progress, with the ranks that have arrived) and `_P2P` (a posted send or recv).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .types import ProcessGroup, ReduceOp, Work, _desc


# --------------------------------------------------------------------------------------------------------------
# What each collective does to the data. `calls` holds one entry per rank of the group, in group order.
# These functions are the whole semantics: read them to see what an all-reduce is.


# How two ranks' values combine, elementwise, for each reduce op. AVG sums, then divides once at the end.
_COMBINE = {
    ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PRODUCT: torch.mul,
    ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum,
    ReduceOp.BAND: torch.bitwise_and, ReduceOp.BOR: torch.bitwise_or, ReduceOp.BXOR: torch.bitwise_xor,
}


_DATA_PTR = torch.Tensor.data_ptr  # (bound at import: a rank's data_ptr() is guarded while a run is on, guards.py)


def _reduce_into(out: torch.Tensor, tensors: list[torch.Tensor], op: ReduceOp) -> None:
    """out = tensors[0] (op) tensors[1] (op) ..., elementwise, in rank order (so every run gets the same bits).
    `out` may be tensors[0] itself."""
    out, first = out.data, tensors[0]
    if (_DATA_PTR(out), out.shape, out.stride()) != (_DATA_PTR(first), first.shape, first.stride()):
        out.copy_(first)
    combine = _COMBINE[op]
    for t in tensors[1:]:
        combine(out, t, out=out)
    if op is ReduceOp.AVG:  # floating point only: dist refuses AVG on integers, as torch.distributed does
        out /= len(tensors)


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


def _all_to_all_single(calls):
    """[a0 a1 a2] [b0 b1 b2] [c0 c1 c2] -> [a0 b0 c0] [a1 b1 c1] [a2 b2 c2]: rank j ends with every rank's j-th
    chunk, in rank order. Chunks are rows (dim 0) of the sizes each rank gave: `in_splits`, what it sends to each
    rank; `out_splits`, what it receives from each."""
    for j, dst in enumerate(calls):
        received = dst.output.data.split(dst.out_splits)
        for i, src in enumerate(calls):
            received[i].copy_(src.input.data.split(src.in_splits)[j])


def _all_to_all(calls):
    """The list form of all_to_all_single: rank j's output_tensor_list[i] gets rank i's input_tensor_list[j]."""
    for j, dst in enumerate(calls):
        for i, src in enumerate(calls):
            dst.output_list[i].data.copy_(src.input_list[j])


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
        self.label = ""  # the record_function label active when the rank called it
        self.queued = None  # its place in the rank's communication queue (clock.Queued)


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
    callers: tuple = ()  # the learner's lines that called the function that posted it (a helper's callers)
    label: str = ""  # the record_function label active when it was posted
    queued: object = None  # its place in the rank's communication queue (clock.Queued)

    def accepts(self, send: _P2P) -> bool:  # self is a recv
        return (send.peer == self.rank and (self.peer is None or self.peer == send.rank)
                and send.tag == self.tag and send.group is self.group)

    def describe(self) -> str:
        if self.kind == "send":
            what = (f"send of {_desc(self.tensor)} to rank {self.peer} (tag {self.tag}); rank {self.peer} has "
                    f"posted no matching recv")
        else:
            src = "any rank" if self.peer is None else f"rank {self.peer}"
            what = f"recv into {_desc(self.tensor)} from {src} (tag {self.tag}); {src} has posted no matching send"
        return what + f"\n      at {self.site}" + "".join(f"\n      called from {c}" for c in self.callers)
