"""The world: all the state of one run, the rank threads, and the baton that passes between them.

One rank runs at a time. A rank's thread runs `fn` until it makes a communication call or returns; then it hands
the baton to the next rank, in rank order, that can make progress (`yield_baton`), and sleeps until the baton
comes back. So every run interleaves the same way. If no rank can make progress but some have not returned, the
run fails and says why. A supervisor in the caller's thread stops a rank that computes for too long without
communicating.

A rank whose code raises is finished; the others run on until each returns, raises or waits for it, so that an
error every rank makes is reported as such, not as the error of whichever rank the baton reached first. Only the
rank's own thread may call `dist`: a thread the rank starts, or a `dist` kept after its run, gets RankThreadError.

`World` inherits its communication methods from matching.py (sends with recvs, the ranks of a collective),
handles.py (async ops and wait), deadlock.py (what a stuck run looks like) and failures.py (a rank's own error,
which thread may call dist). The dispatch mode that watches each rank's ops is in mode.py, and the `dist` that
each rank's `fn` receives in dist.py.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
import time

import torch
from torch._C import _DisableTorchDispatch

from . import escapes, guards, host, watchdog
from .clock import CostModel, RankClock
from .collectives import _Collective, _P2P
from .deadlock import _Diagnosis
from .dist import SimDist
from .failures import _FINISHED, _Failures, _async_raise, _keep_stopping, _note
from .handles import _Handles
from .matching import _Matching
from .memory import AT_IMPORT, Ledger, SiteFinder, StorageTracker, describe_frame, place_inputs, private_copy
from .mode import _RankMode
from .types import ProcessGroup, TimeLimitError, UnmatchedError, Work, _Abort, _desc


# --------------------------------------------------------------------------------------------------------------
# The world: the ranks, the baton.


class _RankState:
    """One rank of the run: its thread, its turn with the baton, what it waits for, its clock."""

    def __init__(self, rank: int):
        self.rank = rank
        self.status = "ready"  # ready | running | blocked | done | failed (its code raised)
        self.waiting: Work | None = None
        self.wait_site = ""
        self.wait_callers: list[str] = []
        self.go = threading.Lock()
        self.go.acquire()  # held: the rank's thread blocks on it until the baton is handed over
        self.thread: threading.Thread | None = None
        self.loading = False  # making the rank's own fn (sim.run's make_fn): its tensors are its own, charged to it
        self.clock = RankClock()
        self.seq: dict[int, int] = {}  # group id -> number of collectives this rank has called on it
        self.labels: list[str] = []  # active record_function names
        self.untracked = False  # the runtime's own tensor work, invisible to the ledger and the isolation check
        self.inflight: list = []  # (storage key, lo, hi, read_ok, work, what, tensor)
        self.unwaited: list[Work] = []
        self.calls = 0  # dist calls this rank has made (handles.py: a poll repeated with no other call between)
        self.stuck_polls: tuple[int, set[int]] = (-1, set())  # (its last call, the handles it polled) while stuck
        self.rng = None
        self.result = None
        self.flops = 0
        self.items_read = 0  # numbers read out of tensors one at a time (guards.py)
        self.last_site = ""
        self.site = lambda: "?"  # the learner's line now (set by World: SiteFinder.here)
        self.host = None  # Part IV: the rank's host timeline (host.py), when the run has one


class World(_Matching, _Handles, _Diagnosis, _Failures):
    """All the state of one run. Nothing is global, so runs are independent and repeatable."""

    def __init__(self, world_size: int, cost: CostModel, seed: int, timeout: float, library_files=(),
                 harness_files=()):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.size, self.cost, self.seed, self.timeout = world_size, cost, seed, timeout
        self.ranks = [_RankState(r) for r in range(world_size)]
        for r in self.ranks:  # (guards.py: a tensor torch made outside an op, such as get_rng_state's, is the rank's)
            r.adopt_storage = functools.partial(self._adopt_storage, r.rank)
        self.ledgers = [Ledger(r, (lambda s=s: s.clock.compute)) for r, s in enumerate(self.ranks)]
        self.storage = StorageTracker(self.ledgers)
        self.sites = SiteFinder(library_files, harness_files)
        self.sites.bottom = World._run_rank.__code__
        self.charge_imports = True  # tensors make_fn's import makes are charged (sim.run's charge_imports)
        self.collective_timeout: int | None = None  # Part IV (watchdog.py): ticks a call may take, None: forever
        self.flight = None  # Part IV: the flight recorder (flight_recorder.py), when sim.run turns it on
        self.host_profile = None  # Part IV: the ranks' host (host.py), when sim.run gives them one
        self.ops: dict = {}  # an OpOverload's _op -> what the dispatch mode needs to know of it (mode._Op)
        self.costs: dict = {}  # ((FLOPs, bytes, class), dtype) -> (OpCost, ticks) of the ops met (mode.py)
        for r in self.ranks:
            r.site = self.sites.here
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
        self.error: BaseException | None = None  # the run's own error: a deadlock, a mismatch, a time limit, ...
        self.failed_rank: int | None = None
        self.rank_errors: dict[int, BaseException] = {}  # what each rank's own code raised
        self.ended = False  # run() has returned: a `dist` kept from this run is dead
        self._thread_ranks: dict[int, _RankState] = {}  # thread ident -> the rank that thread runs
        self.running = 0
        self.turn_started = time.monotonic()  # when the running rank got the baton (for the time limit)
        self._mutex = threading.Lock()
        self._done = threading.Lock()
        self._done.acquire()
        self._done_signalled = False
        self._local = threading.local()

    # ---- small helpers

    def guard_caller(self) -> _RankState | None:
        """The rank whose own code is running in this thread, if any (guards.py asks before refusing)."""
        rank = getattr(self._local, "rank", None)
        if rank is None:
            return None
        me = self.ranks[rank]
        if me.untracked and escapes.runtime_is_calling():  # (a rank that sets the flag itself stays a rank: allowed.py)
            return None
        return me

    def _adopt_storage(self, rank: int, storage) -> None:
        self.storage.adopt(storage, rank, self.sites.allocation_site())

    def rank_state(self, rank: int) -> _RankState:
        return self.ranks[rank]

    def current_rank(self) -> int:
        return getattr(self._local, "rank", self.running)

    def site(self) -> str:
        return self.sites.here()

    def untracked(self, me) -> _Untracked:
        """The runtime's own tensor work (moving data, placing inputs): off the ledger, outside the isolation
        check, and without paying for the dispatch mode on every op."""
        return _Untracked(me)

    def isolation_message(self, rank: int, owner, t: torch.Tensor, what: str) -> str:
        where = self.sites.here()
        if owner is None:
            return (f"rank {rank} used a {_desc(t)} tensor that lives on no rank, in {what} at {where}. "
                    f"It was made outside the simulated ranks (a global? a module-level constant? a default "
                    f"argument? a thread the rank started?). Create it inside the rank's function, or pass it in "
                    f"through sim.run(args=...).")
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
        finished = me.status in _FINISHED
        if block_on is not None and not block_on._done:
            me.status, me.waiting = "blocked", block_on
        elif not finished:
            me.status = "ready"
        with self._mutex:
            if self.aborted:
                raise _Abort
            nxt = self._next_runnable(me.rank)
            if nxt is None and self.unblock_out_of_order():  # an op held back by the issue order only
                nxt = self._next_runnable(me.rank)
            if nxt is None:
                if all(r.status in _FINISHED for r in self.ranks):
                    self._finish_locked()
                    return
                # Nobody can run: a deadlock, unless a rank has raised (then the others wait for it in vain).
                self._fail_locked(None if self.rank_errors else self._stuck_error())
                raise _Abort
            self.running, self.turn_started = nxt.rank, time.monotonic()
            if nxt is me:
                me.status, me.waiting = "running", None
                return
            nxt.status, nxt.waiting = "running", None
            if not finished:
                me.rng = _rng_state(me)
            nxt.go.release()
        if finished:
            return
        me.go.acquire()
        if self.aborted:
            raise _Abort
        _set_rng_state(me, me.rng)

    def _finish_locked(self) -> None:
        if self.rank_errors:  # a rank raised, and every other rank has finished: that error is the story
            self._signal_done()
            return
        dangling = [p.describe() for p in self.sends + self.recvs]
        dangling += [f"{c.where()}, which ranks {sorted(c.calls)} entered at "
                     f"{'; '.join(x.site for x in c.calls.values())}, but ranks "
                     f"{[r for r in c.group.ranks if r not in c.calls]} never did" for c in self.open.values()]
        if dangling:
            self.error = UnmatchedError(
                "every rank returned, but some communication was never matched:\n  - " + "\n  - ".join(dangling))
        else:
            self.error = self._unwaited_error()
        self._signal_done()

    def _fail_locked(self, error: BaseException | None, rank: int | None = None) -> None:
        """Stop the run: wake every rank so that it unwinds. `error` is the run's own (None: a rank's error)."""
        if self.error is None and error is not None:
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


    # ---- running a function on every rank

    def _place(self, me: _RankState, args):
        """Copy the harness's tensors onto this rank: they count on its ledger, and belong to it."""
        def copy_tensor(t):
            with self.untracked(me):
                copy = private_copy(t)
            self.storage.adopt(copy.untyped_storage(), me.rank, "input placed on the rank by sim.run")
            return copy

        return place_inputs(args, copy_tensor)

    def _make_fn(self, me: _RankState, make_fn):
        """The rank's own fn, made in its own thread: a module imported here (sim.run's make_fn) is this rank's,
        as each real process imports its own. The tensors its lines make belong to the rank and are charged to its
        ledger from the start; more than guards.IMPORT_BYTES of them is refused (guards.check_import). Its random
        draws leave the rank's stream alone. (A notebook's module is copied here, not imported: the copies of its
        globals are made by the grader's lines, and stay off the ledger.)"""
        me.loading = True
        try:
            fn = make_fn(me.rank)
        finally:
            me.loading = False
            _set_rng_state(me, me.rng)
        if self.charge_imports:
            made = self.ledgers[me.rank].live_by_line()  # nothing else is on the ledger yet: the inputs come next
            guards.check_import(me.rank, [(site.replace(f"  {AT_IMPORT}", ""), nbytes) for site, nbytes, _ in made])
        return fn

    def _rank_main(self, me: _RankState, fn, make_fn, args) -> None:
        ident = threading.get_ident()
        self._local.rank = me.rank
        self._thread_ranks[ident] = me
        _active.world = self
        try:
            self._run_rank(me, fn, make_fn, args)
        finally:  # a later thread may get this ident: it must not pass for this rank (failures.caller)
            self._thread_ranks.pop(ident, None)

    def _run_rank(self, me: _RankState, fn, make_fn, args) -> None:
        me.go.acquire()
        if self.aborted:
            return
        try:
            # Ranks take turns, so a rank gains nothing from intra-op threads, and OpenMP teams started from
            # many threads fight over the cores (measured: 3x slower on 2 cores).
            torch.set_num_threads(1)
            torch.set_rng_state(me.rng)
            with _RankMode(self, me):
                if make_fn is not None:
                    fn = self._make_fn(me, make_fn)
                placed = self._place(me, tuple(args))
                me.result = fn(SimDist(self, me.rank), *placed)
                self.storage.close_rank(me.rank)  # a storage resized in place since an op last showed it
                self.ledgers[me.rank].close()  # what the rank holds as it returns, its inputs included
                del placed
        except _Abort:
            return
        except BaseException as exc:  # the learner's error: this rank is finished; the others run on
            self._rank_failed(me, exc)
            return
        me.status = "done"
        try:
            self.yield_baton(me)
        except _Abort:
            pass

    def run(self, fn, args, rank_args, make_fn=None) -> None:
        """Run `fn` (or each rank's `make_fn(rank)`) on every rank until all return; re-raise the first error.
        (sim.run collects the result.)"""
        if getattr(_active, "world", None) is not None:
            raise RuntimeError("sim.run cannot be called from inside a simulated rank")
        main_rng, main_threads = torch.get_rng_state(), torch.get_num_threads()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # frees by reference counting only, so the ledger is the same on every run
        guards.install(self.guard_caller)
        if self.host_profile is not None:  # Part IV: the tensor methods that copy data to the host are syncs
            host.install()
        cpu = _current_cpu()
        try:
            for r in self.ranks:
                torch.manual_seed((self.seed * 65_537 + r.rank) % (2**63))
                r.rng = torch.get_rng_state()
                per_rank = tuple(rank_args[r.rank]) if rank_args is not None else ()
                r.thread = _RankThread(target=self._rank_main, args=(r, fn, make_fn, (*args, *per_rank)),
                                       name=f"sim-rank-{r.rank}", daemon=True)
                r.thread.cpu = cpu
                r.thread.start()
            self.running, self.turn_started = 0, time.monotonic()
            self.ranks[0].status = "running"
            self.ranks[0].go.release()
            self._supervise()
        finally:
            self.ended = True
            if self.host_profile is not None:
                host.uninstall()
            guards.uninstall(self.guard_caller)
            torch.set_rng_state(main_rng)
            torch.set_num_threads(main_threads)
            if gc_was_enabled:
                gc.enable()
        if self.rank_errors:
            raise watchdog.on_error(self, self._rank_error())  # Part IV: the error carries the flight recorder
        if self.error is not None:
            error = watchdog.on_error(self, self.error)
            if self.failed_rank is not None:
                _note(error, f"(raised on rank {self.failed_rank} of {self.size}; the other ranks were stopped)")
                try:
                    error.sim_rank = self.failed_rank
                except AttributeError:
                    pass
            raise error

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
                    where = describe_frame(self.sites.site_frame(_current_frame(culprit.thread)))
                    if now - self.turn_started > self.timeout:
                        error = TimeLimitError(
                            f"rank {culprit.rank} ran for more than {self.timeout:g} s of wall time without "
                            f"communicating or returning; it was at {where}. An endless loop? (If the work is really "
                            f"that long, raise the limit: `python -m grader check --timeout SECONDS`, or "
                            f"sim.run(..., timeout=SECONDS).)")
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
            # A rank thread unwinds at once, unless it catches the stop (`except BaseException` in a loop): then
            # raise it again and again until the thread ends, for at most 5 s here, and after that from a daemon.
            stop = time.monotonic() + 0.5
            for r in self.ranks:
                r.thread.join(timeout=max(0.0, stop - time.monotonic()))
            stuck = [r for r in self.ranks if r.thread.is_alive()]
            if stuck:
                _keep_stopping([r.thread for r in stuck])
                stop = time.monotonic() + 5.0
                for r in stuck:
                    r.thread.join(timeout=max(0.0, stop - time.monotonic()))
                stuck = [r.rank for r in stuck if r.thread.is_alive()]
                if stuck and self.error is not None:
                    which = f"rank {stuck[0]}'s thread" if len(stuck) == 1 else f"the threads of ranks {stuck}"
                    _note(self.error, f"({which} did not stop within 5 s of being stopped: it catches every "
                                      f"exception (`except BaseException`), or is busy in C code. It is abandoned: it "
                                      f"keeps running in this process, using the CPU, until the process ends "
                                      f"(a command-line run ends as usual; in a notebook, restart the kernel).)")


class _Untracked:
    """`with world.untracked(me):` the runtime's own tensor work. torch's Python dispatch is switched off for it
    (`_DisableTorchDispatch`, one C++ guard: popping and pushing back the mode stack, as
    `_disable_current_modes()` does, cost 12 us a time, measured), so no op of it reaches the rank's mode; the
    flag keeps the guards (guards.py) off for it as well."""

    __slots__ = ("me", "guard")

    def __init__(self, me):
        self.me = me

    def __enter__(self) -> None:
        self.guard = _DisableTorchDispatch()  # (the original, bound at import: escapes.py guards the name in a run)
        self.guard.__enter__()
        self.me.untracked = True

    def __exit__(self, *exc) -> None:
        self.me.untracked = False
        self.guard.__exit__(*exc)


# A rank's random-number state is saved and restored at every switch of the baton, by the generator's own methods
# (what torch.get_rng_state and set_rng_state call): torch.get_rng_state is guarded while a run is on (the state a
# rank takes is the rank's memory: guards.py), and the guard's question, whose code is calling, was a third of a
# collective's cost. Neither call reaches the dispatcher (the generator copies its state in C++), so there is no
# mode to switch off; `untracked` is set all the same, so that an op one of them made on another torch would be
# the runtime's own, not the rank's.
_GENERATOR = torch.default_generator


def _rng_state(me) -> torch.Tensor:
    me.untracked = True
    try:
        return _GENERATOR.get_state()
    finally:
        me.untracked = False


def _set_rng_state(me, state: torch.Tensor) -> None:
    me.untracked = True
    try:
        _GENERATOR.set_state(state)
    finally:
        me.untracked = False


class _RankThread(threading.Thread):
    """A rank's thread. threading.Thread keeps its target and arguments on the object while it runs, and a rank's
    code can reach its own thread object (threading.current_thread(), through logging's `threading`): the target,
    World._rank_main, is bound to the world, and the arguments hold the rank's state. So they are taken off the
    object before the rank's code starts (what a rank holds is a view without levers: allowed.py).

    Every rank's thread of a run keeps to one CPU, the one the run started on (Linux; `cpu` None elsewhere): one
    rank runs at a time, so nothing runs in parallel to lose, and handing the baton to a thread on another CPU
    costs a wake-up across CPUs: measured on 2 cores, a 4-rank all-reduce of 8 bytes took 309 us with the threads
    free to move and 136 us on one CPU (the hand-off itself about 50 against 6 us)."""

    cpu: int | None = None

    def run(self):
        target, args = self._target, self._args
        del self._target, self._args, self._kwargs
        if self.cpu is not None:
            try:
                os.sched_setaffinity(0, {self.cpu})  # (0: this thread alone)
            except OSError:  # a CPU this process may not use after all: run anywhere, as before
                pass
        target(*args)


def _current_cpu() -> int | None:
    """The CPU this thread runs on now (Linux: field 39 of /proc/thread-self/stat), or None where that is unknown
    or the process may use only one CPU anyway."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        return None
    try:
        with open("/proc/thread-self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        cpu = int(fields[36])  # (fields 3 onwards after the command's closing parenthesis: 39 is the 37th)
    except (OSError, ValueError, IndexError):
        return None
    return cpu if cpu in os.sched_getaffinity(0) else None


_active = threading.local()  # .world: the World whose rank runs in this thread (see sim.current_ledger)


def calling_rank_ledger():
    """The memory ledger of the simulated rank whose thread calls this, or None (sim.current_ledger hands out a
    read-only view of its figures)."""
    world = getattr(_active, "world", None)
    return None if world is None else world.ledgers[world.current_rank()]


def _current_frame(thread: threading.Thread):
    import sys

    return sys._current_frames().get(thread.ident)


