"""Communication is matching: the part of `World` that pairs each send with its recv and gathers the ranks of
each collective.

A call posts what the rank brings and gets a `Work` handle back. When its partners have posted theirs (the
matching recv; the last rank of the group), the data moves (collectives.py for a collective, one copy for a
send). Each call also takes its place in its rank's communication queue when it is issued; once matched, the op
goes on the clock as soon as everything issued before it on each of its ranks is there (clock.py: issue order,
as NCCL's stream), and its handles are done. A rank that needs the result waits on its handle: `wait()` passes
the baton on (world.py) until then.

A collective reads all of its inputs before it writes any output, as gloo does: an input that overlaps an output
of its own rank (`reduce_scatter_tensor(out, inp)` with `out` a chunk of `inp`; `all_gather_into_tensor(out,
out[r*k:(r+1)*k])`) is copied first, off the ledger (`_snapshot_aliased_inputs`), so collectives.py stays plain.

Work handles (in flight, wait, poll) are in handles.py; what a stuck run looks like, in deadlock.py.

`_Matching` is a mixin: `World` (world.py) inherits these methods and holds the state they use (`open`,
`sends`, `recvs`, `ranks`, ...).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import torch

from . import watchdog
from .clock import Queued, QueuedOp, phase, place_out_of_order, place_ready
from .collectives import _Call, _Collective, _P2P
from .deadlock import _doing, _lines
from .handles import _overlaps
from .types import (NON_GROUP_MEMBER, CollectiveMismatchError, IsolationError, P2PMismatchError, ProcessGroup, Work,
                    _Abort, _desc, world_of)

if TYPE_CHECKING:
    from .world import _RankState


# The collectives whose input and output are different arguments: the field of `_Call` that holds the input.
_INPUT_FIELD = {"all_gather": "tensor", "all_gather_into_tensor": "input", "reduce_scatter_tensor": "input"}


def _snapshot_aliased_inputs(calls) -> None:
    """gloo reads every input of a collective before it writes any output. collectives.py writes the outputs rank
    by rank, so an input that overlaps an output of its own rank (measured on gloo: ZeRO's in-place
    `reduce_scatter_tensor(out, inp)` with `out` rank r's chunk of `inp`, an all-gather whose input sits in another
    rank's slot of the output) would be overwritten before it is read. Copy such an input first. (Inputs of
    different ranks never overlap: each rank has its own memory.)"""
    for c in calls:
        field = _INPUT_FIELD.get(c.name)
        if field is not None and any(_overlaps(getattr(c, field), w) for w in c.writes):
            setattr(c, field, getattr(c, field).detach().clone())


def _shown(value) -> str:
    """A value of a call's signature as a message shows it: a reduce op by its name (SUM), a tensor as float64[8]."""
    return value.name if isinstance(value, enum.Enum) else str(value)


class _Matching:
    """World's communication methods: collectives and point to point."""

    # ---- collectives

    def collective(self, me: _RankState, call: _Call, group, async_op: bool):
        self.caller(me, call.name)
        group = self.check_group(me, group, call.name)
        reads, writes = call.reads, call.writes
        for t in reads:
            self.check_owned(me, t, call.name)
        for t in writes:
            if not any(t is r for r in reads):  # (an all-reduce's tensor is both: checked once)
                self.check_owned(me, t, call.name)
        if me.inflight:
            for t in call.reads:
                self._check_access(me, t, False, call.name)
            for t in call.writes:
                self._check_access(me, t, True, call.name)
        gid = group.id
        seq = me.seq.get(gid, 0)
        me.seq[gid] = seq + 1
        if me.host is not None:  # Part IV: the host issues the call (host.py)
            me.host.launch(me.clock)
        call.rank, call.issued = me.rank, me.clock.compute
        call.site, call.callers = self.sites.here_and_callers()
        call.phase = phase()
        call.label = me.labels[-1] if me.labels else ""
        me.last_site = call.site
        key = (gid, seq)
        coll = self.open.get(key)
        if coll is None:
            coll = self.open[key] = _Collective(call.name, group, seq)
        if coll.calls:
            self._check_signature(coll, call)
        work = Work(self, me.rank, call.name, call.site)
        work._describe = lambda: (f"{coll.where()}; ranks {sorted(coll.calls)} have arrived, waiting for ranks "
                                  f"{[r for r in group.ranks if r not in coll.calls]}"
                                  + _lines("at", call.site, call.callers) + _doing(call.phase, me))
        call.work = work
        if call.name != "new_group":  # bookkeeping, not traffic: it takes no place in the queue
            call.queued = self._issue(me, work, ("send", "recv"))
            watchdog.on_issue(self, me, work, group, call=call)  # Part IV: its timeout, the flight recorder
        coll.calls[me.rank] = call
        if async_op:
            self._mark_inflight(me, work, call.reads, call.writes, call.name)
        if len(coll.calls) == len(group.ranks):
            del self.open[key]
            self._complete(coll)
        if async_op:
            self.yield_baton(me)
            return work
        self.wait(me, work, call.site, call.callers)
        return None

    def _check_signature(self, coll: _Collective, call: _Call) -> None:
        first = next(iter(coll.calls.values()))
        if first.name != call.name:
            diff = f"rank {first.rank} called {first.name} at {first.site}, rank {call.rank} called {call.name} at {call.site}"
        else:
            keys = [k for k in first.signature if first.signature[k] != call.signature.get(k)]
            if not keys:
                return
            diff = "; ".join(f"rank {first.rank} passed {k}={_shown(first.signature[k])} (at {first.site}), "
                             f"rank {call.rank} passed {k}={_shown(call.signature.get(k))} (at {call.site})"
                             for k in keys)
        error = CollectiveMismatchError(
            f"ranks met in {coll.where()} with different arguments: {diff}. Every rank of the group must make the "
            f"same collective call with tensors of the same shape and dtype (torch.distributed would hang or "
            f"silently compute garbage here).")
        watchdog.on_mismatch(self, call, coll.group)  # Part IV: the flight recorder keeps the call that parted
        with self._mutex:
            self._fail_locked(error)
        raise _Abort

    def _complete(self, coll: _Collective) -> None:
        calls = [coll.calls[r] for r in coll.group.ranks]
        coll.calls.clear()  # waiting ranks hold `coll` until they resume: it must not keep the others' tensors alive
        agree = getattr(calls[0], "agree", None)  # what must agree between pairs of ranks (an all-to-all's sizes)
        problem = agree(calls) if agree is not None else None
        if problem:
            with self._mutex:
                self._fail_locked(CollectiveMismatchError(f"ranks met in {coll.where()} with sizes that do not "
                                                          f"match: {problem}"))
            raise _Abort
        with self.untracked(self.ranks[self.current_rank()]):
            _snapshot_aliased_inputs(calls)
            calls[0].exchange(calls)
        n = len(calls)
        if coll.name == "new_group":  # bookkeeping, not traffic: it takes no simulated time
            for c in calls:
                c.work._finish(self.ranks[c.rank].clock.compute)
            return
        if hasattr(calls[0], "sent"):  # an all-to-all: each rank moves its own amount; the busiest one sets the time
            ticks = self.cost.comm_ticks(coll.name, max(max(c.sent, c.received) for c in calls), n,
                                          ranks=coll.group.ranks)
        else:
            ticks = self.cost.comm_ticks(coll.name, calls[0].nbytes, n, ranks=coll.group.ranks)
        wires = {}  # bytes a rank brings -> bytes it sends (the same for every rank but in an all-to-all)
        ranks = coll.group.ranks
        for c in calls:
            amount = c.sent if hasattr(c, "sent") else c.nbytes
            wire = wires.get(amount)
            if wire is None:
                wire = wires[amount] = self.cost.wire_bytes(coll.name, amount, n, ranks=ranks)
            c.queued.event = dict(kind=coll.name, nbytes=c.nbytes, wire_bytes=wire, phase=c.phase,
                                  peers=ranks, site=c.site, label=c.label)
        self._matched([c.queued for c in calls], ticks)

    def _issue(self, me: _RankState, work: Work, lanes: tuple[str, ...]) -> Queued:
        """The call takes its place at the back of the rank's communication queue (the lanes it will use)."""
        entry = Queued(me.rank, me.clock.compute, work, {}, lanes)
        me.clock.issue(entry)
        work._queued = entry
        return entry

    def unblock_out_of_order(self) -> bool:
        """Nobody can move. If a rank waits for an op that has been matched but is queued behind an earlier op of
        its own that is not (which waits, directly or not, for this one), place the waited-for op out of order,
        as gloo would run it, and warn that NCCL would hang here. True if any rank can move now."""
        clocks = [r.clock for r in self.ranks]
        moved = False
        for r in self.ranks:
            work = r.waiting if r.status == "blocked" else None
            entry = getattr(work, "_queued", None)
            if entry is None or entry.op is None:
                continue
            ahead = next((a for e in entry.op.entries for a in [clocks[e.rank].blocking(e)] if a is not None), None)
            what = getattr(work, "issued_as", work.what)
            if ahead is not None and ahead.work is not None:
                earlier = getattr(ahead.work, "issued_as", ahead.work.what)
                self.warnings.append(
                    f"rank {r.rank}'s {what} at {work.site} ran before rank {ahead.rank}'s {earlier} at "
                    f"{ahead.work.site}, which was issued before it but waits for it: gloo runs this, but on NCCL, "
                    f"whose streams run each rank's communication in the order it was issued, it would hang")
            place_out_of_order(clocks, entry.op)
            place_ready(clocks, range(len(self.ranks)))
            moved = True
        return moved

    def _matched(self, entries: list[Queued], ticks: int) -> None:
        """The data has moved: the op goes on the clock once it is first in the queue of each of its ranks."""
        op = QueuedOp(entries, ticks)
        for e in entries:
            e.op = op
        place_ready([r.clock for r in self.ranks], [e.rank for e in entries])

    def check_group(self, me: _RankState, group, what: str) -> ProcessGroup:
        if group is None:
            return self.WORLD
        if group is NON_GROUP_MEMBER:
            raise ValueError(f"rank {me.rank} called {what} with GroupMember.NON_GROUP_MEMBER: new_group returned "
                             f"that because rank {me.rank} is not in the group. Call {what} only on ranks of the group.")
        if not isinstance(group, ProcessGroup) or world_of(group) is not self:
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
        self.caller(me, kind)
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
        site, callers = self.sites.here_and_callers()
        me.last_site = site
        if me.host is not None:  # Part IV: the host issues the call (host.py)
            me.host.launch(me.clock)
        work = Work(self, me.rank, kind, site)
        p = _P2P(kind, me.rank, peer, tag, group, tensor, me.clock.compute, site, work, phase(), callers)
        work._describe = lambda: p.describe() + _doing(p.phase, me)
        p.queued = self._issue(me, work, (kind,))
        p.label = me.labels[-1] if me.labels else ""
        watchdog.on_issue(self, me, work, group, p2p=p)  # Part IV: its timeout, the flight recorder
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
        nbytes = send.tensor.numel() * send.tensor.element_size()
        for p in (send, recv):
            p.queued.event = dict(kind=p.kind, nbytes=nbytes, wire_bytes=nbytes, phase=p.phase,
                                  peers=(send.rank, recv.rank), site=p.site, label=p.label)
        recv.work._source = send.rank
        self._matched([send.queued, recv.queued],
                      self.cost.comm_ticks("send", nbytes, 2, ranks=(send.rank, recv.rank)))
