"""What stops a run, besides a deadlock: a rank's own error, a handle a rank never waited for, a `dist` call from
a thread that is not the rank's, and a thread that will not stop.

A rank whose code raises is finished, and the others run on until each returns, raises or waits for a rank that
has finished: then the run stops and reports the error of the first rank (in rank order) that raised, saying
which other ranks raised the same (an error every rank makes is reported as such, not as the error of whichever
rank the baton reached first).

`_Failures` is a mixin: `World` (world.py) inherits it and holds the state it uses (`ranks`, `rank_errors`,
`sites`, `size`, `ended`, `_thread_ranks`, `_mutex`, and `yield_baton`, `_fail_locked`, `site`).
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import TYPE_CHECKING

from .types import IsolationError, RankCrashed, RankThreadError, UnwaitedWorkError, _Abort

if TYPE_CHECKING:
    from .memory import SiteFinder
    from .world import _RankState

_FINISHED = ("done", "failed")


class _Failures:
    """World's account of what went wrong on a rank, and of who may call dist."""

    # ---- which thread may call dist

    def caller(self, owner: _RankState, what: str) -> _RankState:
        """The rank state of the thread calling `what` on `owner`'s dist or handle, which must be `owner`'s own
        thread. Once the run has stopped, every call in a rank's thread unwinds it (a loop that catches the
        first stop meets another at its next call)."""
        me = self._thread_ranks.get(threading.get_ident())  # (a rank's thread leaves it as it ends)
        if me is owner:
            if self.aborted:
                raise _Abort
            if getattr(me, "crashed", False):  # an injected failure (filesystem.py): a dead process reaches no one
                raise RankCrashed(f"rank {me.rank} is dead")
            me.calls += 1
            return me
        if me is not None:
            if what == "wait()" or what == "is_completed()":
                raise IsolationError(f"rank {me.rank} called {what} at {self.site()} on a handle that belongs to "
                                     f"rank {owner.rank}: each rank waits for its own operations only")
            raise RankThreadError(f"rank {me.rank} called {what} at {self.site()} through the dist of rank "
                                  f"{owner.rank}: each rank must use the dist its function was given")
        if self.ended:
            raise RankThreadError(
                f"{what} was called on rank {owner.rank}'s dist (or one of its work handles) after its run had "
                f"ended (sim.run had returned). A dist lives only while its run does: keep no reference to it, "
                f"or to a work handle, for later.")
        error = RankThreadError(
            f"rank {owner.rank} called {what} at {self.site()} from another thread "
            f"({threading.current_thread().name!r}) than the rank's own. The simulator runs each rank "
            f"in one thread and watches only that thread's ops; call dist from the rank's function itself "
            f"(async_op=True, isend and irecv overlap communication without threads).")
        with self._mutex:
            self._fail_locked(error, owner.rank)
        raise error

    def _rank_failed(self, me: _RankState, exc: BaseException) -> None:
        """Record a rank's own error and let the other ranks run until each returns, raises or waits for a rank
        that has finished: then the run stops and reports it (see `_rank_error`)."""
        with self._mutex:
            if self.aborted:
                return
            self.rank_errors[me.rank] = exc
        me.status = "failed"
        try:
            self.yield_baton(me)
        except _Abort:
            pass

    def _rank_error(self) -> BaseException:
        """The error of the first rank (in rank order) that raised, with a note on which other ranks raised the
        same (the same type from the same line) and which were stopped."""
        first = min(self.rank_errors)
        error = self.rank_errors[first]
        same = [r for r, e in sorted(self.rank_errors.items()) if _same_error(e, error, self.sites)]
        others = [r for r in sorted(self.rank_errors) if r not in same]
        stopped = [r.rank for r in self.ranks if r.status not in _FINISHED]
        if len(same) == self.size:
            note = f"(raised on every rank, {self.size} of {self.size}; this is rank {first}'s"
        elif len(same) > 1:
            note = f"(raised on ranks {same} of {self.size}; this is rank {first}'s"
        else:
            note = f"(raised on rank {first} of {self.size}"
        if others:
            note += f"; ranks {others} raised other errors"
        if stopped:
            note += f"; ranks {stopped} were stopped" if len(stopped) > 1 else f"; rank {stopped[0]} was stopped"
        _note(error, note + ")")
        try:
            error.sim_rank = first
        except AttributeError:
            pass
        return error

    def _unwaited_error(self) -> UnwaitedWorkError | None:
        """Every rank returned; refuse the handles a rank never waited for (on real processes their messages can
        be lost, or their results read half written)."""
        dropped = [w for r in self.ranks for w in r.unwaited]
        if not dropped:
            return None
        lines = [f"rank {w._rank} returned without calling wait() on the handle of its {w._describe_op}, issued "
                 f"at {w.site}" for w in dropped]
        return UnwaitedWorkError(
            lines[0] + (".\nAlso:\n  " + "\n  ".join(lines[1:]) if len(lines) > 1 else ".") +
            "\nOn real processes a send whose handle is never waited for can be lost (gloo: the receiver then "
            "hangs), and a receive or collective that is not waited for may not have written its result yet. Keep "
            "every handle and call work.wait() on it before using its buffer and before the rank returns (for "
            "batch_isend_irecv, on every handle of the list it returns).")


def _async_raise(thread: threading.Thread) -> None:
    """Raise _Abort inside another thread at its next Python bytecode: how a runaway loop is stopped."""
    if thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Abort))


def _same_error(a: BaseException, b: BaseException, sites: SiteFinder) -> bool:
    """Two ranks raised the same error: the same type, from the same line of the learner's code (the innermost
    line outside torch, the standard library and the simulator)."""
    def origin(e):
        tb, found = e.__traceback__, None
        while tb is not None:
            if not sites._is_internal(tb.tb_frame.f_code.co_filename):
                found = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
            tb = tb.tb_next
        return found

    return type(a) is type(b) and origin(a) == origin(b)


def _keep_stopping(threads: list[threading.Thread]) -> None:
    """Threads that did not unwind (a loop that catches BaseException around every call): raise _Abort in them
    again and again, from a daemon thread, until they end. Python cannot kill a thread; every dist call and every
    tensor op in them raises as well, so the loop spins only while it computes with plain Python (what cannot be
    helped). A loop in C code (one long tensor op) ends when the op does."""
    def stopper():
        while any(t.is_alive() for t in threads):
            for t in threads:
                _async_raise(t)
            time.sleep(0.05)

    threading.Thread(target=stopper, name="sim-stopper", daemon=True).start()


def _note(error: BaseException, text: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(text)
