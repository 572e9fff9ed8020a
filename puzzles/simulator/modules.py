"""What a learner's puzzle module may import: a list of what is allowed (allowed.py's "modules" rule).

    torch                   torch and its public submodules (torch.nn, torch.nn.functional, torch.autograd,
                            torch.distributed, torch.utils.checkpoint, torch.jit, ...): none whose name has a part
                            that starts with "_" (torch._C, torch.utils._python_dispatch: the dispatcher's insides)
    the puzzles' API        puzzles.model, puzzles.sim and its public names (`from puzzles.sim import cuda`)
    the standard library    math, cmath, numbers, fractions, decimal, statistics, random, operator, functools,
                            itertools, collections, heapq, bisect, copy, dataclasses, enum, abc, typing, contextlib,
                            warnings, logging, traceback, time, datetime, string, re, textwrap, pprint, __future__
    per puzzle              what its stub needs, declared on its spec (`PuzzleSpec.modules`): p18's io, zlib, json,
                            hashlib and struct, for the checkpoint's bytes

Everything else is refused, at the line that imports it, with one sentence naming the module and what to use. The
modules a learner might reach for and why each is refused: a thread or a process (threading, multiprocessing,
concurrent, subprocess, os: work neither timed nor counted), files (os, pathlib, tempfile, shutil, io outside p18:
state a restart should have lost), raw memory or another copy of a tensor (ctypes, mmap, numpy, pickle, array:
memory the ledger cannot see), the interpreter's own state (sys, builtins, inspect, gc, importlib: frames, the
namespace every rank shares, the modules the grader runs on), and the grader and the simulator's insides.

Enforced twice: the grader reads every import statement of the puzzle's source before loading it (at module level
and inside functions, `from x import y` and relative imports: grader/backends/imports.py), and while a run is on a
module that a rank's own line imports for the first time (`__import__` with a computed name, an import in `exec`)
is refused by Python's "import" audit event (PEP 578), raising ImportRefusedError. The event fires only when a
module is not loaded yet: what the list refuses to a module already loaded is the static scan's, and what such a
module would give (a thread, a file, a frame) is refused by its own rule in allowed.py and escapes.py.
"""

from __future__ import annotations

import importlib
import sys

# torch and the puzzles' API (their public submodules, by the rules in allowed_module)
TORCH = "torch"
PUZZLES = ("puzzles.model", "puzzles.sim")
# The standard library a learner would expect: numbers, containers, functional tools, types, messages, time.
STANDARD = ("math", "cmath", "numbers", "fractions", "decimal", "statistics", "random", "operator", "functools",
            "itertools", "collections", "heapq", "bisect", "copy", "dataclasses", "enum", "abc", "typing",
            "contextlib", "warnings", "logging", "traceback", "time", "datetime", "string", "re", "textwrap", "pprint",
            "__future__")
# Every puzzle's extras, for a run that names no puzzle (sim.run called in a notebook): the union of the specs'.
ANY_PUZZLE = ("io", "zlib", "json", "hashlib", "struct")

# Why a module is refused, and what to use instead, for those a learner might reach for.
_THREADS = ("it starts threads or processes, whose work the rank's clock and memory ledger never see",
            "do the work in the rank's own code, and overlap communication with async_op=True and wait()")
_FILES = ("it reaches files, which a restart would not lose and no ledger sees",
          "keep state in tensors, and in p18 write through the `fs` your function receives")
_MEMORY = ("it copies tensors out of torch, into memory the ledger cannot see", "use torch's ops on the tensors")
_INTERPRETER = ("it reaches the interpreter's own state: its frames, its modules, the names every rank shares",
                "use the `dist` your function receives and torch's public API")
WHY = {
    "threading": _THREADS, "_thread": _THREADS, "multiprocessing": _THREADS, "concurrent": _THREADS,
    "subprocess": _THREADS, "asyncio": _THREADS, "signal": _THREADS, "os": ("it starts processes and reaches files",
                                                                          _FILES[1]),
    "posix": ("it starts processes and reaches files", _FILES[1]),
    "pathlib": _FILES, "tempfile": _FILES, "shutil": _FILES, "io": _FILES, "glob": _FILES, "shelve": _FILES,
    "sqlite3": _FILES, "socket": ("it reaches the network", "send tensors with the `dist` your function receives"),
    "ctypes": _MEMORY, "mmap": _MEMORY, "numpy": _MEMORY, "pickle": _MEMORY, "copyreg": _MEMORY, "array": _MEMORY,
    "marshal": _MEMORY, "struct": _MEMORY, "zlib": _MEMORY,
    "sys": _INTERPRETER, "builtins": _INTERPRETER, "inspect": _INTERPRETER, "gc": _INTERPRETER,
    "importlib": _INTERPRETER, "types": _INTERPRETER, "weakref": _INTERPRETER, "atexit": _INTERPRETER,
    "grader": ("it is the grader itself", "use the `dist` your function receives and puzzles.sim"),
    "puzzles": ("it is not the puzzles' API", "use puzzles.model and puzzles.sim's public names"),
}
_now = ANY_PUZZLE  # the extras of the puzzle being graded (puzzle_modules), every puzzle's outside a grading run


def extras_now() -> tuple:
    return _now


class puzzle_modules:
    """While a puzzle is graded, the runtime's list is its own: the base list and its spec's extras."""

    def __init__(self, extras):
        self.extras = tuple(extras)

    def __enter__(self):
        global _now
        self.saved, _now = _now, self.extras

    def __exit__(self, *exc):
        global _now
        _now = self.saved


_DEFAULT = ("no puzzle needs it", "use torch, puzzles.model, puzzles.sim and the standard modules on the list")


def allowed_module(name: str, extras=ANY_PUZZLE) -> bool:
    """Whether a learner's module may import `name` (a module's full dotted name)."""
    parts = name.split(".")
    if parts[0] == TORCH:
        return not any(p.startswith("_") for p in parts)
    if name == "puzzles":
        return True  # (`from puzzles import sim`: the names imported are checked by allowed_from)
    if parts[0] == "puzzles":
        return ".".join(parts[:2]) in PUZZLES and not any(p.startswith("_") for p in parts)
    return any(name == m or name.startswith(m + ".") for m in (*STANDARD, *extras))


def allowed_from(module: str, name: str, extras=ANY_PUZZLE) -> bool:
    """Whether `from module import name` is allowed: the module is, and the name is public and, where it may be
    a submodule, an allowed one (`from torch import _C`, `from puzzles import simulator` are refused)."""
    if not allowed_module(module, extras):
        return False
    if name == "*":
        return True
    if name.startswith("_") and module != "__future__":
        return False
    if module == "puzzles":
        return f"puzzles.{name}" in PUZZLES
    if module == "puzzles.sim":  # its API is what it says it exports, not every name its own code uses
        return name in _sim_exports()
    return True


def _sim_exports() -> tuple:
    """puzzles.sim's __all__ (looked up, not imported by name here: puzzles.sim imports this module's users)."""
    sim = sys.modules.get("puzzles.sim") or importlib.import_module("puzzles.sim")
    return tuple(sim.__all__)


def refusal(module: str, where: str, extras=ANY_PUZZLE) -> str:
    """The one sentence a learner gets: the module, where, why and what to use."""
    why, instead = WHY.get(module.split(".")[0], _DEFAULT)
    if module.split(".")[0] in extras:  # (allowed here, but not that part of it)
        why, instead = _DEFAULT
    if module.split(".")[0] == TORCH:
        why, instead = ("it is torch's internals, not its public API",
                        "use torch's public API (torch, torch.nn, torch.nn.functional, torch.autograd, "
                        "torch.distributed)")
    return (f"{where} imports {module}, which a puzzle's code may not import ({why}): {instead} "
            f"(what may be imported: puzzles/simulator/modules.py).")
