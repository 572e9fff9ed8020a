"""The memory ledger: how many bytes each rank holds, over simulated time, and who allocated them.

A tensor is a view onto a *storage*, the block of memory that really costs bytes. The runtime watches every op a
rank runs (a TorchDispatchMode, see mode.py) and registers each storage the op materialises: activations,
tensors autograd saves for backward, gradient buffers, recomputed activations, buffers that messages are
received into. Views (slices, transposes, `.detach()`) and in-place ops make no new storage, so they cost
nothing. When the last reference to a storage goes, a finalizer takes its bytes off the ledger.

So `peak` is the high-water mark a real device would have needed for these tensors (less the allocator's
rounding and fragmentation, which a simulator has no business guessing).
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
import weakref

import torch

from .types import Registry

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__))
# The simulator's own files: this folder, and sim.py beside it (the entry point).
_SIM_FILES = {os.path.join(_HERE, f) for f in os.listdir(_HERE) if f.endswith(".py")} | {
    os.path.join(os.path.dirname(_HERE), "sim.py")}


class SiteFinder:
    """Finds the learner's line in a Python stack: the innermost frame outside torch, the standard library,
    the simulator and any `library_files` (shared helpers such as the puzzles' model.py). A frame of the
    `harness_files` (the grader's code around the learner's) is the site only when no learner's frame lies
    beyond it: when the learner calls the grader's wrapper of `dist`, the learner's call is the site."""

    def __init__(self, library_files=(), harness_files=()):
        self._internal = {os.path.abspath(f) for f in library_files} | _SIM_FILES
        self._harness = {os.path.abspath(f) for f in harness_files}
        self._cache: dict[str, bool] = {}
        self._harness_cache: dict[str, bool] = {}
        self._sites: dict = {}  # (code, line) -> the site
        self._sites_at: dict = {}  # (code, instruction) -> the site
        self._callers: dict = {}  # (code, line) -> a caller's line
        self._callers_at: dict = {}  # (code, instruction) -> a caller's line
        # The code of the frame that calls a rank's function (World._run_rank): only the simulator's and the
        # standard library's frames lie beyond it, so a walk for the learner's callers stops there.
        self.bottom = None

    def _is_internal(self, filename: str) -> bool:
        hit = self._cache.get(filename)
        if hit is None:
            path = os.path.abspath(filename) if not filename.startswith("<") else filename
            in_stdlib = path.startswith(_STDLIB_DIR) and "-packages" not in path[len(_STDLIB_DIR):]
            hit = path.startswith(_TORCH_DIR) or in_stdlib or path in self._internal
            self._cache[filename] = hit
        return hit

    def _is_harness(self, filename: str) -> bool:
        hit = self._harness_cache.get(filename)
        if hit is None:
            hit = self._harness_cache[filename] = bool(self._harness) and os.path.abspath(filename) in self._harness
        return hit

    def user_frame(self, frame):
        """The innermost frame outside torch, the standard library and the simulator (harness or learner)."""
        while frame is not None and self._is_internal(frame.f_code.co_filename):
            frame = frame.f_back
        return frame

    def _learner_beyond(self, frame):
        """The first learner's frame (not internal, not harness) at or beyond `frame`, and its code; (None, None)
        if there is none (none lies beyond a `bottom` frame)."""
        while frame is not None:
            code = frame.f_code
            if code is self.bottom:
                break
            name = code.co_filename
            if not (self._is_internal(name) or self._is_harness(name)):
                return frame, code
            frame = frame.f_back
        return None, None

    def site_frame(self, frame):
        """The frame that names the site: the innermost frame outside torch, the standard library and the
        simulator; but if that is the harness's and its caller (beyond any more harness frames) is the learner's,
        the learner's (the learner called the grader's wrapper of `dist`)."""
        return self._site_frame(frame)[0]

    def _site_frame(self, frame):
        """site_frame(frame), and its code (None, None with no frame). Every read of frame.f_code is audited by
        Python ("object.__getattr__": each audit hook of the process runs, escapes.py's included), so the walk
        reads it once per frame and hands the code on; a site is found once per op or call, not again."""
        internal = self._cache
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            hit = internal.get(name)
            if not (self._is_internal(name) if hit is None else hit):
                break
            frame = frame.f_back
        else:
            return None, None
        if not self._harness or not self._is_harness(name):
            return frame, code
        caller = frame
        while caller is not None and self._is_harness(caller.f_code.co_filename):
            caller = caller.f_back
        if caller is not None and not self._is_internal(caller.f_code.co_filename):
            return caller, caller.f_code
        return frame, code

    def here(self) -> str:
        """The learner's line that led to this call."""
        return self.site_at(sys._getframe(1))

    def site_at(self, frame) -> str:
        """The learner's line that led to `frame` (the innermost frame of the walk: here()'s caller)."""
        return self._site_in(*self._site_frame(frame))

    def _site_in(self, frame, code) -> str:
        """The site that `frame` (a site frame, and its code) is at, looked up by its instruction: f_lineno
        decodes the code's line table from its start on every read (measured: 14,000 instructions in a 60-line
        function), f_lasti is one field."""
        if frame is None:
            return "?"
        at = (code, frame.f_lasti)
        site = self._sites_at.get(at)
        if site is None:
            site = self._sites_at[at] = self._site_on_line(frame, code)
        return site

    def callers(self, limit: int = 2) -> list[str]:
        """The learner's lines beyond the site, innermost first: the calls that led to the function the site is
        in (a helper's callers), up to `limit` of them. Harness frames are left out."""
        return self._callers_beyond(self.site_frame(sys._getframe(1)), limit)

    def here_and_callers(self, limit: int = 2) -> tuple[str, list[str]]:
        """here() and callers(limit), from one walk of the stack."""
        frame, code = self._site_frame(sys._getframe(1))
        return self._site_in(frame, code), self._callers_beyond(frame, limit)

    def _site_on_line(self, frame, code) -> str:
        """'p3_data_parallel.py:42: dist.all_reduce(g)' for the site frame (and its code), '[harness] ...' for the
        grader's: one per line of code."""
        key = (code, frame.f_lineno)
        site = self._sites.get(key)
        if site is None:
            site = describe_frame(frame)
            if self._is_harness(code.co_filename):
                site = f"[harness] {site}"  # the grader's own code around the learner's, not the learner's
            self._sites[key] = site
        return site

    def _callers_beyond(self, frame, limit: int) -> list[str]:
        out = []
        frame = frame.f_back if frame is not None else None
        while frame is not None and len(out) < limit:
            frame, code = self._learner_beyond(frame)
            if frame is None:
                break
            at = (code, frame.f_lasti)  # (as _site_in: f_lineno only the first time)
            line = self._callers_at.get(at)
            if line is None:
                key = (code, frame.f_lineno)
                if key not in self._callers:
                    self._callers[key] = describe_frame(frame)
                line = self._callers_at[at] = self._callers[key]
            out.append(line)
            frame = frame.f_back
        return out

    def allocation_site(self) -> str:
        """The learner's line that allocated a storage, and the autograd node when backward allocated it."""
        site = self.here()
        node = torch._C._current_autograd_node()
        return f"{site}  [backward: {node.name()}]" if node is not None else site


# What a tensor made while the rank imported the learner's file is charged as: memory the rank holds from its start
# (a module-level workspace or cache is memory like any other; both backends charge it).
AT_IMPORT = "[module level: made when the rank imported the file]"


def place_inputs(value, copy_tensor, memo: dict | None = None):
    """The harness's arguments as one rank receives them: every tensor in `value` (nested in lists, tuples,
    namedtuples, dicts) replaced by `copy_tensor(t)`, the same tensor twice by the same copy; the rest as is."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            memo[id(value)] = copy_tensor(value)
        return memo[id(value)]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(place_inputs(v, copy_tensor, memo) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(place_inputs(v, copy_tensor, memo) for v in value)
    if isinstance(value, dict):
        return type(value)((k, place_inputs(v, copy_tensor, memo)) for k, v in value.items())
    return value


def private_copy(t: torch.Tensor, device=None) -> torch.Tensor:
    """A detached copy of t that keeps its requires_grad (and stays an nn.Parameter if it was one)."""
    copy = t.detach().clone() if device is None else t.detach().to(device, copy=True)
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=t.requires_grad)
    return copy.requires_grad_(True) if t.requires_grad else copy


def describe_frame(frame) -> str:
    """'p3_data_parallel.py:42: dist.all_reduce(g)' for a frame, or '?' when there is none."""
    if frame is None:
        return "?"
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(filename, lineno, frame.f_globals).strip()
    return f"{os.path.basename(filename)}:{lineno}: {text}" if text else f"{os.path.basename(filename)}:{lineno}"


class Ledger:
    """One rank's memory over simulated time.

    current:   bytes alive now (frozen when the rank returns).
    peak:      the most bytes alive at any moment; peak_tick, the simulated time it was first reached.
    timeline:  [(tick, bytes alive)] after every allocation and free.
    peak_by_line(): what was alive at the peak, grouped by the line of the learner's code that allocated it.
    """

    def __init__(self, rank: int, now):
        self.rank = rank
        self._now = now  # callable: this rank's compute-stream tick
        self.current = 0
        self.peak = 0
        self.peak_tick = 0
        self.timeline: list[tuple[int, int]] = [(0, 0)]
        self.closed = False
        self._live: dict[int, tuple[int, str]] = {}  # storage key -> (bytes, allocation site)
        self._peak_live: dict[int, tuple[int, str]] = {}
        self._peak_pending = False  # a new peak was reached and nothing was freed since
        self._lock = threading.RLock()  # a storage can die in any thread
        self._still_alive = lambda key: False  # set by the StorageTracker that feeds this ledger
        self._alive_keys = lambda: ()  # the keys of this rank's storages that are alive now (StorageTracker)
        self._problems: list[str] = []  # what audit() will report

    def allocate(self, key: int, nbytes: int, site: str) -> None:
        with self._lock:
            if self.closed:
                return
            self._live[key] = (nbytes, site)
            self.current += nbytes
            now = self._now()
            self.timeline.append((now, self.current))
            if self.current > self.peak:
                self.peak, self.peak_tick = self.current, now
                self._peak_pending = True

    def free(self, key: int) -> None:
        """Called by the storage's finalizer when it dies (StorageTracker). Anything else calling it, for a storage
        that is still alive, or losing track of a storage, is noted: the grader treats it as tampering."""
        with self._lock:
            if self.closed:
                return
            if key not in self._live:
                self._problems.append("a storage it was tracking had been removed from it before the storage died")
                return
            if self._still_alive(key):
                self._problems.append("free() was called for a storage that is still alive")
                return
            if self._peak_pending:  # the peak ends here: remember what made it (cheaper than copying at every new peak)
                self._peak_live = dict(self._live)
                self._peak_pending = False
            nbytes, _ = self._live.pop(key)
            self.current -= nbytes
            self.timeline.append((self._now(), self.current))

    def resize(self, key: int, nbytes: int, site: str) -> None:
        """A storage this ledger holds changed size in place (`resize_`, an `out=` tensor that grew, a storage's
        own `resize_`): its bytes are now `nbytes` (0: it holds nothing, and leaves the ledger until it grows)."""
        with self._lock:
            if self.closed:
                return
            old, old_site = self._live.get(key, (0, site))
            if nbytes == old:
                return
            if nbytes < old and self._peak_pending:  # the peak ends here, as at a free
                self._peak_live = dict(self._live)
                self._peak_pending = False
            if nbytes:
                self._live[key] = (nbytes, old_site)
            else:
                self._live.pop(key, None)
            self.current += nbytes - old
            self.timeline.append((self._now(), self.current))
            if self.current > self.peak:
                self.peak, self.peak_tick = self.current, self._now()
                self._peak_pending = True

    def close(self) -> None:
        """Freeze the ledger (the rank returned); later frees are not this rank's business any more."""
        with self._lock:
            if self._peak_pending:
                self._peak_live = dict(self._live)
                self._peak_pending = False
            self.closed = True

    def audit(self) -> list[str]:
        """Is this ledger consistent with itself and with the storages it tracks? [] if so; else what is off.
        The grader reads the ledger's figures for its verdicts, and the learner's code runs in the same process:
        a figure written by anything but the ledger's own bookkeeping shows up here."""
        with self._lock:
            problems = list(self._problems)
            live_sum = sum(n for n, _ in self._live.values())
            highest = max((b for _, b in self.timeline), default=0)
            if self.current != live_sum:
                problems.append(f"its current bytes ({self.current:,}) are not the sum of the storages it holds "
                                f"({live_sum:,})")
            if self.peak != highest:
                problems.append(f"its peak ({self.peak:,} bytes) is not the highest point of its own timeline "
                                f"({highest:,} bytes)")
            if self.timeline and self.timeline[-1][1] != self.current:
                problems.append("its timeline does not end at its current bytes")
            missing = [k for k in self._alive_keys() if k not in self._live]
            if missing:
                problems.append(f"{len(missing)} storage(s) of this rank that are still alive are missing from it")
            return problems

    def live_by_line(self) -> list[tuple[str, int, int]]:
        return _group(self._live)

    def peak_by_line(self) -> list[tuple[str, int, int]]:
        """[(site, bytes, number of storages)] alive at the peak, largest first."""
        with self._lock:
            live = dict(self._live) if self._peak_pending else self._peak_live
        return _group(live)

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "current": self.current,
            "peak": self.peak,
            "peak_tick": self.peak_tick,
            "timeline": [list(p) for p in self.timeline],
            "peak_by_line": [{"site": s, "bytes": b, "count": c} for s, b, c in self.peak_by_line()],
        }

    def __repr__(self):
        return f"Ledger(rank={self.rank}, current={self.current}, peak={self.peak} at tick {self.peak_tick})"


_VIEWED = Registry()  # LedgerView -> its Ledger


class LedgerView:
    """What a rank may read of its own memory ledger (`sim.current_ledger()`): its figures, read-only, and no
    lever on the ledger. The view keeps no reference to the ledger in any attribute (it is found in this module's
    registry), and hands out copies: `current`, `peak`, `peak_tick` and `timeline` as they are when read,
    `live_by_line()` and `peak_by_line()` as the Ledger's. Nothing a rank does with it changes what the grader
    reads."""

    __slots__ = ("__weakref__",)

    def __init__(self, ledger: Ledger):
        _VIEWED.hold(self, ledger)

    rank = property(lambda self: _VIEWED.of[id(self)].rank)
    current = property(lambda self: _VIEWED.of[id(self)].current)
    peak = property(lambda self: _VIEWED.of[id(self)].peak)
    peak_tick = property(lambda self: _VIEWED.of[id(self)].peak_tick)
    timeline = property(lambda self: tuple(_VIEWED.of[id(self)].timeline))

    def __setattr__(self, name, value):
        raise AttributeError(f"sim.current_ledger() is a view of the rank's memory ledger, read-only: its {name} "
                             f"cannot be written (the grader reads the ledger itself)")

    def live_by_line(self) -> list[tuple[str, int, int]]:
        return _VIEWED.of[id(self)].live_by_line()

    def peak_by_line(self) -> list[tuple[str, int, int]]:
        return _VIEWED.of[id(self)].peak_by_line()

    def __repr__(self):
        return f"LedgerView(rank={self.rank}, current={self.current}, peak={self.peak} at tick {self.peak_tick})"


def _group(live: dict) -> list[tuple[str, int, int]]:
    sizes: dict[str, list[int]] = {}
    for nbytes, site in live.values():
        entry = sizes.setdefault(site, [0, 0])
        entry[0] += nbytes
        entry[1] += 1
    return sorted(((s, b, c) for s, (b, c) in sizes.items()), key=lambda x: (-x[1], x[0]))


class StorageTracker:
    """Which rank owns each storage, and its ledger entry.

    Storages are keyed by the address of their StorageImpl (`untyped_storage()._cdata`), which is unique while
    the storage lives; a weakref finalizer drops the key (and the ledger's bytes) when it dies, before the
    address can be reused. A storage can change size while it lives (`t.resize_`, an `out=` tensor, a storage's
    own `resize_`): `see` charges what it holds now each time an op shows it, and `close_rank` once more when the
    rank returns, so memory grown in place is charged as memory made afresh.
    """

    def __init__(self, ledgers):
        self.ledgers = ledgers
        self.owner: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self._sizes: dict[int, int] = {}  # key -> the bytes the ledger holds for it now
        self._free: dict[int, int] = {}  # key -> bytes it holds free of charge (an uncharged storage's first size)
        for rank, ledger in (ledgers.items() if isinstance(ledgers, dict) else enumerate(ledgers)):
            ledger._still_alive = self._alive
            ledger._alive_keys = lambda rank=rank: [k for k, r in list(self.owner.items())
                                                    if r == rank and self._sizes.get(k) and self._alive(k)]

    def _alive(self, key: int) -> bool:
        ref = self._refs.get(key)
        return ref is not None and ref() is not None

    def adopt(self, storage, rank: int, site: str, charge: bool = True) -> None:
        """Make `rank` the owner of `storage` and (with `charge`) put its bytes on the rank's ledger. Without
        `charge`, the bytes it holds now stay off the ledger, and only what it grows beyond them is charged."""
        key = storage._cdata
        if key not in self.owner:
            self._adopt(key, storage, rank, site, charge)

    def _adopt(self, key: int, storage, rank: int, site: str, charge: bool = True) -> None:
        self.owner[key] = rank
        ledger, owner, refs, sizes, free = self.ledgers[rank], self.owner, self._refs, self._sizes, self._free
        nbytes = storage.nbytes()

        def _finalize(_ref, key=key, ledger=ledger):
            owner.pop(key, None)
            refs.pop(key, None)
            free.pop(key, None)
            if sizes.pop(key, 0):  # what the ledger holds for it (audit() checks exactly that)
                ledger.free(key)

        refs[key] = weakref.ref(storage, _finalize)
        free[key] = 0 if charge else nbytes
        sizes[key] = nbytes if charge else 0
        if charge and nbytes:
            ledger.allocate(key, nbytes, site)

    def see(self, storage, rank: int, site) -> None:
        """An op of `rank` made or touched `storage`: adopt it if it is new, else charge its size now if it changed
        in place. `site` is the allocation site, or a callable that returns it (only asked when needed)."""
        key = storage._cdata
        if key not in self.owner:
            self._adopt(key, storage, rank, site() if callable(site) else site)
        else:
            self._recharge(key, storage, site)

    def _recharge(self, key: int, storage, site) -> None:
        charged = max(0, storage.nbytes() - self._free.get(key, 0))
        ledger = self.ledgers[self.owner[key]]
        if charged == self._sizes.get(key, 0) or ledger.closed:  # (a closed ledger keeps what it held)
            return
        self._sizes[key] = charged
        ledger.resize(key, charged, site() if callable(site) else site)

    def close_rank(self, rank: int, site: str = "[storage resized in place]") -> None:
        """The rank returns: charge every storage of it that changed size since an op last showed it."""
        for key, r in list(self.owner.items()):
            ref = self._refs.get(key)
            storage = ref() if r == rank and ref is not None else None
            if storage is not None:
                self._recharge(key, storage, site)

    def owner_of(self, storage):
        return self.owner.get(storage._cdata)
