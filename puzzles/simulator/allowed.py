"""What a rank may do: a list of what is allowed, enforced while the rank runs (not a list of cheats caught).

Every figure a verdict rests on (the memory ledger, the FLOP count, the clock) is measured by one dispatch mode
that watches one thread per rank. So while a run is on, a rank's own code may do only what that mode can measure:

    threads and processes  the rank's own thread, nothing else. Starting a thread (`threading`, `_thread`,
                           `concurrent.futures`, `multiprocessing`'s pools) or a process (`os.fork`, `os.system`,
                           `subprocess`, `multiprocessing`, `os.posix_spawn`, `os.exec*`) raises RankThreadError
                           naming the line: work there would be neither timed nor counted. torch's intra-op
                           threads are torch's (they run the rank's ops, which the mode sees) and stay.
                           (here)
    tensors stay in torch  no numpy, list, bytes, pickle or DLPack copies beyond a small running total per rank
                           (guards.py), no address (data_ptr() is an opaque number), no ctypes by any path
                           (here, by its audit events); tensors torch makes outside an op (get_rng_state, a
                           torch.Generator's get_state, torch.load's) are the rank's own
    ops                    an aten op runs only if op_costs.py has a cost formula for it, or it is a view or
                           a metadata op: anything else (a custom op included) raises UncostedOpError naming
                           the op and the line (mode.py), never a guessed charge
    the mode stays on      no switch that takes torch's dispatch modes off; no files written, no memory mapped
                           (escapes.py)
    frames and objects     no frame taken (sys._getframe, inspect's frames, a traceback's or a generator's
                           frame), no tracer or profiler set, no list of the process's objects (gc): each reaches
                           the simulator's own state below the rank's code. traceback.print_exc, logging and
                           warnings take frames for their own work and run as before (here)
    code                   no code made under a file name of ours, torch's or Python's (here)
    views without levers   what a rank is handed (dist, its groups and work handles, sim.current_ledger()'s view
                           of the ledger's figures) leads by no attribute to the world, a rank's state, its clock
                           or its ledger (dist.py, types.py, memory.LedgerView)
    modules                only those on modules.py's list: torch's public API, puzzles.model, puzzles.sim's
                           public names, a few standard modules (math, functools, itertools, collections,
                           dataclasses, typing, logging, ...) and what the puzzle's stub needs (p18: io, zlib,
                           json, hashlib, struct). Read in the source before it is loaded (grader/backends/
                           imports.py), and refused while a run is on by the "import" audit event when the rank's
                           own line imports a module that is not loaded yet (here): ImportRefusedError

The grader's and the simulator's own code (the checkpoint disk, the supervisor), torch's code called by them, and
a library's code run while it is imported are not the rank's and are let through. How the rules are enforced:
processes by Python's audit events (PEP 578: `os.fork`, `os.exec`, `os.posix_spawn`, `os.spawn`, `os.system`,
`subprocess.Popen`, raised in C, from any thread, by a hook that cannot be removed), and by `_posixsubprocess`'s
`fork_exec` (which multiprocessing's spawn calls without an event). Python 3.10 and 3.11 raise no event when a
thread starts, so `_thread.start_new_thread` (every Python thread starts there; `threading` holds its own
reference) is replaced while a run is on. Each of these asks whose line made the call, by its file name; so code made
during a run under a file name of ours, torch's or Python's (compile, `code.replace`, marshal) is refused too. Code that digs the original out of this module is a learner who reads the
grader to defeat it: that is left to the batch mode's process isolation (docs/grading.md, "Threat model").
"""

from __future__ import annotations

import _thread
import inspect
import logging
import os
import sys
import threading
import traceback

from . import escapes, modules
from .types import HiddenMemoryError, ImportRefusedError, IsolationError, RankThreadError

try:
    import _posixsubprocess
except ImportError:  # (Windows)
    _posixsubprocess = None

_WHY = ("a rank runs in one thread, the only one its clock, its memory ledger and its FLOP count watch, so work "
        "done in another thread or process would be neither timed nor counted.")
_INSTEAD = {
    "thread": "Do the work in the rank's own code; to overlap communication with computation, pass async_op=True "
              "(or use isend/irecv) and wait() on the handle later.",
    "process": "Do the work in the rank's own code; the simulator already runs every rank for you.",
}

# audit event -> what it starts, in the learner's words
PROCESS_EVENTS = {
    "os.fork": "a process (os.fork)", "os.forkpty": "a process (os.forkpty)",
    "os.posix_spawn": "a process (os.posix_spawn)", "os.spawn": "a process (os.spawn*)",
    "os.exec": "a program (os.exec*)", "os.system": "a process (os.system)",
    "subprocess.Popen": "a process (subprocess)", "os.startfile": "a program (os.startfile)",
}


# ctypes' audit events: an address read or written, a foreign function called, a library loaded. With ctypes (reached
# by `import ctypes`, `torch.ctypes`, numpy.ctypeslib or any other path: the events are raised in C) a rank could
# read or write memory where neither the ledger nor the isolation check looks.
CTYPES_EVENTS = ("ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at", "ctypes.cdata", "ctypes.cdata/buffer",
                 "ctypes.call_function", "ctypes.create_string_buffer", "ctypes.create_unicode_buffer",
                 "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.set_exception")


def _ctypes_event(event: str, args) -> None:
    who = escapes.caller()
    if who is not None and _from_rank_code(sys._getframe(2)):
        raise HiddenMemoryError(
            f"rank {who.rank} used ctypes ({event}) at {who.site()}: inside a rank, tensors stay inside torch. "
            f"ctypes reads and writes memory by its address, where neither the memory ledger nor the isolation "
            f"check looks (another rank's memory, for one). Use torch's ops on the tensors themselves.")


# Code made while a run is on (compile, exec of a string, a code object built or replaced, marshal) under a file name
# of the grader's, the simulator's, torch's or the standard library's would pass for theirs in every check that asks
# whose line a frame is (_from_rank_code here, the ledger's call sites): refused, whatever the rest of the code.
CODE_EVENTS = ("compile", "code.__new__")


def _claims_to_be_ours(filename) -> bool:
    """Whether a file name, as given or as the call sites resolve it (a relative name is taken from the working
    folder: "grader/specs/..." is ours), is ours, torch's, Python's or frozen importlib's."""
    name = filename.decode(errors="replace") if isinstance(filename, bytes) else str(filename or "")
    if name.startswith("<"):
        return name.startswith("<frozen")
    return any(_not_the_ranks(n) for n in {name, os.path.abspath(name), os.path.realpath(name)})


def _not_the_ranks(filename: str) -> bool:
    """Whether code of this file is ours, torch's, Python's or frozen importlib's (never a rank's own)."""
    return filename.startswith(escapes.OURS) or filename.startswith(escapes.PASSING) or filename.startswith("<frozen")


def _code_event(event: str, args) -> None:
    who = escapes.caller()
    filename = args[1] if len(args) > 1 else None
    if who is not None and _claims_to_be_ours(filename) and _from_rank_code(sys._getframe(2)):
        raise RankThreadError(
            f"rank {who.rank} made code under the file name {filename!r} at {who.site()} ({event}): inside a rank, "
            f"code is the rank's own, named for its own file. Code that claims to be the grader's, the simulator's, "
            f"torch's or Python's would be measured as theirs, not the rank's. Call your own functions instead.")


def _marshal_event(event: str, args) -> None:
    who = escapes.caller()
    if who is not None and _from_rank_code(sys._getframe(2)):
        raise RankThreadError(
            f"rank {who.rank} loaded code with marshal at {who.site()}: inside a rank, code is the rank's own, "
            f"named for its own file (marshal can make code that claims to be another file's).")


# Frames and the objects behind them: a frame reaches every frame below it (f_back) and their locals, the
# simulator's own among them (its world, the clock, the ledger), and a tracer or the garbage collector's lists reach
# everything. A rank's own code may take no frame (sys._getframe, inspect's frames, a traceback's or a generator's
# frame) and may not trace, profile or list the objects of the process. Code that takes frames for its own work
# (logging's caller, traceback.print_exc, torch) runs as before: the rule asks who takes the frame, not who asked.
FRAME_ATTRIBUTES = escapes.FRAME_ATTRIBUTES
OBSERVER_EVENTS = {"sys._current_frames": "sys._current_frames()", "sys.settrace": "sys.settrace",
                   "sys.setprofile": "sys.setprofile", "gc.get_objects": "gc.get_objects()",
                   "gc.get_referrers": "gc.get_referrers()", "gc.get_referents": "gc.get_referents()"}
_INSPECT = inspect.__file__
_TRACEBACK = traceback.__file__
_LOGGING = logging.__file__
_busy = threading.local()  # on: the rule itself, or the dispatch mode once per op, takes a frame (not asked again)


def _takes_frames_for(frame) -> bool:
    """Whether the frame that took a frame is the rank's own code, looking through inspect's functions,
    traceback's walk_stack/walk_tb and logging.currentframe (which hand frames on to their caller)."""
    while frame is not None:
        code = frame.f_code
        name = code.co_filename
        if name == _INSPECT or (name == _TRACEBACK and code.co_name in ("walk_stack", "walk_tb")) or (
                name == _LOGGING and code.co_name in ("currentframe", "<lambda>")):
            frame = frame.f_back
            continue
        return not _not_the_ranks(name)
    return False


def _ours(function) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and code.co_filename.startswith(escapes.OURS)


def _frame_attribute(event: str, args) -> None:
    if len(args) > 1 and args[1] in FRAME_ATTRIBUTES:  # (every f_code read raises this event: most return here)
        _frame_event(event, args, 3)


def _frame_event(event: str, args, depth: int = 2) -> None:
    if getattr(_busy, "on", False):
        return
    _busy.on = True
    try:
        frame = sys._getframe(depth)  # (the frame that asked: past this function, _frame_attribute, the hook)
        if frame.f_code.co_filename.startswith(escapes.OURS):  # the simulator's or the grader's own look (each
            return  # call site, every wait): allowed by every rule below, and found before asking whose thread
        who = escapes.caller()
        if who is None:
            return
        if event in ("sys.settrace", "sys.setprofile") and _ours(sys.gettrace() if event == "sys.settrace" else
                                                                 sys.getprofile()):
            return  # a tracer of ours set or cleared (by Python itself, when it raises: grader/core/probe.py)
        if event in OBSERVER_EVENTS:
            refused, what = _from_rank_code(frame), OBSERVER_EVENTS[event]
        else:
            refused = _takes_frames_for(frame)
            what = "sys._getframe (inspect's frames)" if event == "sys._getframe" else f".{args[1]}"
    finally:
        _busy.on = False
    if refused:
        debugger = (" A debugger sets one (breakpoint(), pdb): inside a rank, print what you want to see, or "
                    "step through your function outside sim.run." if event in ("sys.settrace", "sys.setprofile")
                    else "")
        raise IsolationError(
            f"rank {who.rank} took {what} at {who.site()}: inside a rank, the stack below your code is the "
            f"simulator's (its clock, its memory ledger), and a frame, a tracer or the garbage collector's lists "
            f"reach all of it. No puzzle needs them: to see where an error came from, print it "
            f"(traceback.print_exc() works).{debugger}")


def _import_event(event: str, args) -> None:
    """A module imported for the first time while a run is on: refused when the rank's own line imports it (an
    import statement in a function, `__import__` with a computed name, exec) and it is not on modules.py's list.
    A library importing what it needs (torch's lazy imports, logging's) is the library's line, and passes."""
    who = escapes.caller()
    name = args[0] if args else None
    if who is None or not _held or not isinstance(name, str) or modules.allowed_module(name, modules.extras_now()):
        return
    if _not_the_ranks(sys._getframe(2).f_code.co_filename):
        return
    raise ImportRefusedError(modules.refusal(name, f"rank {who.rank} at {who.site()}", modules.extras_now()))


def refuse(who, what: str, kind: str):
    raise RankThreadError(f"rank {who.rank} started {what} at {who.site()}: {_WHY} {_INSTEAD[kind]}")


def _from_rank_code(frame) -> bool:
    """Whether the call at `frame` was made by a rank's own code: walking out past torch's, the standard library's
    and installed packages' frames (threading.Thread.start, subprocess, torch.utils.data), the first other frame
    is the learner's. Ours (the checkpoint disk, the supervisor) and a library being imported are let through."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(escapes.OURS) or name.startswith("<frozen importlib"):
            return False
        if not name.startswith(escapes.PASSING) and not name.startswith("<frozen"):
            return True
        frame = frame.f_back
    return False  # (a thread with no rank code below it: not the rank's)


def _process_event(event: str, args) -> None:
    who = escapes.caller()
    if who is not None and _from_rank_code(sys._getframe(2)):
        refuse(who, PROCESS_EVENTS[event], "process")


def _starter(original, what: str, kind: str):
    def start(*args, **kwargs):
        who = escapes.caller()
        if who is not None and _from_rank_code(sys._getframe(1)):
            refuse(who, what, kind)
        return original(*args, **kwargs)

    start.__name__ = start.__qualname__ = getattr(original, "__name__", "start")
    return start


# (module, name, what it starts, kind): the callables replaced while a run is on
_STARTERS = [(_thread, "start_new_thread", "a thread (_thread.start_new_thread)", "thread"),
             (_thread, "start_new", "a thread (_thread.start_new)", "thread"),
             (threading, "_start_new_thread", "a thread (threading.Thread.start)", "thread")]
if _posixsubprocess is not None:
    _STARTERS.append((_posixsubprocess, "fork_exec", "a process (multiprocessing or subprocess)", "process"))
_saved: list[tuple] = []


_held = []  # [True] while the rules are held: the import list is a puzzle's, not the differential corpus's


def install() -> None:
    """Hold the rules while a run is on (called by guards.install, once for the first run of several; not for
    the differential corpus on gloo, which measures torch.distributed itself, with threads and its own imports)."""
    _held.append(True)
    for module, name, what, kind in _STARTERS:
        original = getattr(module, name, None)
        if original is not None:
            _saved.append((module, name, original))
            setattr(module, name, _starter(original, what, kind))


def uninstall() -> None:
    _held.clear()
    for module, name, original in reversed(_saved):
        setattr(module, name, original)
    _saved.clear()


escapes.HANDLERS.update(dict.fromkeys(PROCESS_EVENTS, _process_event))
escapes.HANDLERS.update(dict.fromkeys(CTYPES_EVENTS, _ctypes_event))
escapes.HANDLERS.update(dict.fromkeys(CODE_EVENTS, _code_event))
escapes.HANDLERS["marshal.loads"] = _marshal_event
escapes.HANDLERS["import"] = _import_event
escapes.HANDLERS.update(dict.fromkeys(("sys._getframe", *OBSERVER_EVENTS), _frame_event))
escapes.HANDLERS["object.__getattr__"] = _frame_attribute
