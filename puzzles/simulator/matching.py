"""Communication is matching: the part of `World` that pairs each send with its recv and gathers the ranks of
each collective.

A call posts what the rank brings and gets a `Work` handle back. When its partners have posted theirs (the
matching recv; the last rank of the group), the data moves (collectives.py for a collective, one copy for a
send), the ranks' communication clocks advance by what the message costs (clock.py), and the handles are
done. A rank that needs the result waits on its handle: `wait()` passes the baton on (world.py) until then.

A collective reads all of its inputs before it writes any output, as gloo does: an input that overlaps an output
of its own rank (`reduce_scatter_tensor(out, inp)` with `out` a chunk of `inp`; `all_gather_into_tensor(out,
out[r*k:(r+1)*k])`) is copied first, off the ledger (`_snapshot_aliased_inputs`), so collectives.py stays plain.

When every rank that has not returned waits and none can ever proceed, `_stuck_error` says why: each rank's
pending call (the learner's line, the lines that called it, and what the rank last computed), or two sets of
ranks stuck in collectives that can never meet.

`_Matching` is a mixin: `World` (world.py) inherits these methods and holds the state they use (`open`,
`sends`, `recvs`, `ranks`, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .clock import Event
from .collectives import _Call, _Collective, _P2P
from .clock import phase
from .mode import _tensors_in, _tensors_out
from .types import (NON_GROUP_MEMBER, CollectiveMismatchError, DeadlockError, InFlightError, IsolationError,
                    P2PMismatchError, ProcessGroup, SimError, Work, WorkError, _Abort, _desc)

if TYPE_CHECKING:
    from .world import _RankState


def _span(t: torch.Tensor):
    """(storage key, first byte, one past the last byte) that tensor `t` can touch."""
    size = t.element_size()
    lo = t.storage_offset()
    hi = lo + (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1 if t.numel() else 0)
    return t.untyped_storage()._cdata, lo * size, hi * size


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may share bytes (the same storage, intersecting byte ranges)."""
    ka, lo_a, hi_a = _span(a)
    kb, lo_b, hi_b = _span(b)
    return ka == kb and lo_a < hi_b and lo_b < hi_a


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


def _written_args(func, args, kwargs) -> list[torch.Tensor]:
    written = []
    positional = [a for a in func._schema.arguments if not a.kwarg_only]
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[i] if (i < len(args) and i < len(positional)) else kwargs.get(a.name)
        written.extend(_tensors_out(value))
    return written


class _Matching:
    """World's communication methods: collectives, point to point, wait(), and what a stuck world looks like."""

    # ---- collectives

    def collective(self, me: _RankState, call: _Call, group, async_op: bool):
        self.caller(me, call.name)
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
        call.phase, call.callers = phase(), self.sites.callers()
        me.last_site = call.site
        coll = self.open.setdefault((group.id, seq), _Collective(call.name, group, seq))
        if coll.calls:
            self._check_signature(coll, call)
        work = Work(self, me.rank, call.name, call.site)
        work._describe = lambda: (f"{coll.where()}; ranks {sorted(coll.calls)} have arrived, waiting for ranks "
                                  f"{[r for r in group.ranks if r not in coll.calls]}"
                                  + _lines("at", call.site, call.callers) + _doing(call.phase, me))
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
            _snapshot_aliased_inputs(calls)
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
        site = self.site()
        me.last_site = site
        work = Work(self, me.rank, kind, site)
        p = _P2P(kind, me.rank, peer, tag, group, tensor, me.clock.compute, site, work, phase(), self.sites.callers())
        work._describe = lambda: p.describe() + _doing(p.phase, me)
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

    # ---- async bookkeeping

    def _mark_inflight(self, me: _RankState, work: Work, reads, writes, what: str) -> None:
        # The entry holds the tensor, as a real Work does until wait(): its memory cannot be freed and reused
        # (by an unrelated tensor that would then look "in flight") while the op may still be using it.
        for t in reads:
            me.inflight.append((*_span(t), True, work, what, t))
        for t in writes:
            me.inflight.append((*_span(t), False, work, what, t))
        work.issued_as = what
        tensors = list({id(t): t for t in [*reads, *writes]}.values())
        work._describe_op = f"{what} of {', '.join(_desc(t) for t in tensors)}" if tensors else what
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
                if not what.startswith("aten."):  # a communication call on a buffer another one is still using
                    remedy = (f"Until that op is waited for, its buffer is not free for another one: give the "
                              f"{what} a tensor of its own (say, a separate receive buffer).")
                else:
                    remedy = (f"Call work.wait() on that handle first: until then the "
                              f"{'data being sent' if read_ok else 'result'} is not yours to "
                              f"{'change' if read_ok else 'use'}.")
                raise InFlightError(
                    f"rank {me.rank} {verb} a {_desc(t)} tensor in {what} at {self.sites.here()} while its "
                    f"async {opname} (issued at {work.site}) was still in flight. {remedy}")

    def wait_handle(self, work: Work) -> None:
        """`work.wait()` in the learner's code: only by the rank that owns it, and a point-to-point handle once
        (gloo's second wait() on a send or recv never returns: measured, the run hangs)."""
        me = self.caller(self.ranks[work._rank], "wait()")
        if work._waited and work.what in ("send", "recv"):
            raise WorkError(
                f"rank {me.rank} called wait() at {self.site()} a second time on the handle of its "
                f"{getattr(work, 'issued_as', work.what)} issued at {work.site} (first waited for at "
                f"{work._wait_site}). On gloo a second wait() on a send or recv handle never returns: wait for "
                f"each point-to-point handle once.")
        work._wait_site = work._wait_site or self.site()
        self.wait(me, work)

    def poll(self, work: Work) -> None:
        """`work.is_completed()`: a communication call (it passes the baton) by the rank that owns the handle.
        A send or recv handle is complete only once waited for (as on gloo), so a rank that polls one while no
        other rank can move would poll forever: that is an error at once."""
        me = self.caller(self.ranks[work._rank], "is_completed()")
        if work.what in ("send", "recv") and not work._waited:
            with self._mutex:
                stuck = self._next_runnable(me.rank) is None
            if stuck:
                raise WorkError(
                    f"rank {me.rank} polls is_completed() at {self.site()} on the handle of its "
                    f"{getattr(work, 'issued_as', work.what)} issued at {work.site}, and no other rank can move. "
                    f"On gloo a send or recv handle says it is complete only once wait() has been called "
                    f"(measured: False long after the data arrived), so this loop would never end: call "
                    f"work.wait() instead of polling.")
        self.yield_baton(me)

    def wait(self, me: _RankState, work: Work) -> None:
        if work._rank != me.rank:
            raise IsolationError(f"rank {me.rank} called wait() on a handle that belongs to rank {work._rank}")
        if not work._done:
            me.wait_site = self.site()
            me.wait_callers = self.sites.callers()
            try:
                self.yield_baton(me, block_on=work)
            finally:
                me.wait_site = ""
        me.clock.compute = max(me.clock.compute, work._end)
        work._waited = True
        me.inflight = [x for x in me.inflight if x[4] is not work]
        if work in me.unwaited:
            me.unwaited.remove(work)

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
                             + (_lines("blocked in wait() at", r.wait_site, r.wait_callers) if waited_elsewhere
                                else ""))
        for a in self.ranks:
            for b in self.ranks:
                pa, pb = self._blocked_p2p(a), self._blocked_p2p(b)
                if a.rank < b.rank and pa and pb and pa.kind == pb.kind == "send" \
                        and pa.peer == b.rank and pb.peer == a.rank:
                    if hasattr(pa.work, "issued_as") or hasattr(pb.work, "issued_as"):  # an isend among them
                        hints.append(f"ranks {a.rank} and {b.rank} both send to each other and neither posts the "
                                     f"matching receive: post an irecv beside each isend (batch_isend_irecv can "
                                     f"carry both).")
                    else:
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


# ---- the learner's lines in a deadlock report


def _lines(head: str, site: str, callers) -> str:
    """'\n      head file:12: code' and a line for each learner's line that called it (a helper's callers)."""
    text = f"\n      {head} {site}" if site else ""
    return text + "".join(f"\n      called from {c}" for c in callers)


def _doing(issued_phase: str, me: _RankState) -> str:
    """What a blocked rank was doing: in autograd's backward (a hook issued the call), or its last compute
    (forward or backward, with its record_function label: 'F3', 'B3')."""
    last = me.clock._last_compute
    if issued_phase == "backward":
        doing = f"rank {me.rank} is in a backward pass (autograd's backward issued the call)"
    elif last is None:
        doing = f"rank {me.rank} has computed nothing yet"
    else:
        doing = f"rank {me.rank}'s last compute: a {last.kind}" + (f" [{last.label}]" if last.label else "")
    return f"\n      {doing}"
