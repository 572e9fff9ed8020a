"""What a stuck run looks like: when every rank that has not returned waits and none can ever proceed,
`_stuck_error` says why: each rank's pending call, on the learner's line, with the lines that called it and what
the rank last computed (a forward or a backward, with its record_function label), or two sets of ranks stuck in
collectives that can never meet.

`_Diagnosis` is a mixin: `World` (world.py) inherits it and holds the state it reads (`ranks`, `sends`, `recvs`,
`open`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import watchdog
from .collectives import _Collective, _P2P
from .types import CollectiveMismatchError, DeadlockError, SimError

if TYPE_CHECKING:
    from .world import _RankState


class _Diagnosis:
    """World's account of a deadlock."""

    def _stuck_error(self) -> SimError:
        return watchdog.timed_out(self, self._why_stuck())  # Part IV: with a collective timeout, the watchdog's

    def _why_stuck(self) -> SimError:
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
                lines.append(f"rank {r.rank}: waits in {self._waiting_in(r.waiting)}"
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

    def _waiting_in(self, work) -> str:
        """What a handle waits for. An op that has been matched (its data has moved) but is queued behind an op
        its rank issued before it, not matched yet, waits for that one: a rank's communication runs in issue
        order (clock.py)."""
        entry = work._queued
        if entry is None or entry.op is None:
            return work._describe()
        for e in entry.op.entries:
            ahead = self.ranks[e.rank].clock.blocking(e)
            if ahead is not None and ahead.work is not None:
                what = getattr(work, "issued_as", work.what)
                return (f"its {what} (at {work.site}), which has been matched but is queued behind rank {e.rank}'s "
                        f"earlier op, issued before it: {ahead.work._describe()}\n      A rank's sends run in the "
                        f"order it issued them, and so do its receives (a collective waits for both), as on NCCL's "
                        f"stream")
        return work._describe()

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
