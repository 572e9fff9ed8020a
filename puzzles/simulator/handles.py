"""Work handles: what an async op's handle promises, and the rules that make a run safe on real backends.

An async op (isend, irecv, batch_isend_irecv, `async_op=True`) marks its tensors *in flight* until its handle is
waited for: a rank that touches them before raises InFlightError (the dispatch mode checks every op, mode.py).
`wait()` is for the rank that owns the handle only, once for a send or recv handle (gloo's second wait() never
returns: WorkError), and every handle must be waited for before its rank returns (world.py raises
UnwaitedWorkError). A send or recv handle says `is_completed()` only once waited for, as gloo's do.

`_Handles` is a mixin: `World` (world.py) inherits these methods and holds the state they use (`ranks`, `sites`,
`_mutex`, and the baton's `yield_baton`, `_next_runnable`, `caller`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import watchdog
from .mode import _tensors_in, _tensors_out
from .types import InFlightError, IsolationError, Work, WorkError, _desc

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


def _written_args(func, args, kwargs) -> list[torch.Tensor]:
    written = []
    positional = [a for a in func._schema.arguments if not a.kwarg_only]
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[i] if (i < len(args) and i < len(positional)) else kwargs.get(a.name)
        written.extend(_tensors_out(value))
    return written



class _Handles:
    """World's work-handle methods: marking tensors in flight, checking an op against them, wait(), polling."""

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
        A send or recv handle is complete only once waited for (as on gloo). A rank may look once and move on;
        but a rank that polls the same handle again, with no other call of its own in between, while no other
        rank can move, polls in a loop that nothing can ever end: that is an error at once."""
        me = self.caller(self.ranks[work._rank], "is_completed()")
        if work.what in ("send", "recv") and not work._waited:
            with self._mutex:
                stuck = self._next_runnable(me.rank) is None
            if stuck:
                last, polled = me.stuck_polls
                if last != me.calls - 1:  # another call came between: the world may have changed since
                    polled = set()
                if id(work) in polled:
                    raise WorkError(
                        f"rank {me.rank} polls is_completed() at {self.site()} on the handle of its "
                        f"{getattr(work, 'issued_as', work.what)} issued at {work.site} again, with no other call "
                        f"in between, and no other rank can move. On gloo a send or recv handle says it is complete "
                        f"only once wait() has been called (measured: False long after the data arrived), so this "
                        f"loop would never end: call work.wait() instead of polling.")
                polled.add(id(work))
                me.stuck_polls = (me.calls, polled)
        self.yield_baton(me)

    def wait(self, me: _RankState, work: Work, site: str | None = None, callers: list[str] | None = None) -> None:
        """Block `me` until `work` is done. `site` and `callers`: the learner's line and its callers, when the
        caller has them already (a blocking collective found them as it was called)."""
        if work._rank != me.rank:
            raise IsolationError(f"rank {me.rank} called wait() on a handle that belongs to rank {work._rank}")
        if not work._done:
            if site is None:
                site, callers = self.sites.here_and_callers()
            me.wait_site = site
            me.wait_callers = callers
            try:
                self.yield_baton(me, block_on=work)
            finally:
                me.wait_site = ""
        me.clock.compute = max(me.clock.compute, work._end)
        if getattr(work, "_timeout", None) is not None:  # Part IV: a partner later than the timeout
            watchdog.on_wait(self, me, work)
        work._waited = True
        me.inflight = [x for x in me.inflight if x[4] is not work]
        if work in me.unwaited:
            me.unwaited.remove(work)
