"""Loading the learner's puzzle file, and describing what went wrong in it, for every backend."""

from __future__ import annotations

import ast
import collections
import copy
import importlib.util
import itertools
import os
import re
import sys
import traceback
import types
from pathlib import Path

import torch

from puzzles import sim

from ..core.result import ERROR, NOT_ATTEMPTED, PARTIAL, PuzzleResult
from ..core.spec import PuzzleSpec
from .error_causes import likely_cause

GRADER_DIR = Path(__file__).resolve().parent.parent
HARNESS_FILES = tuple(str(p) for p in GRADER_DIR.rglob("*.py"))  # the grader's own code: its lines are "[harness]"
_counter = itertools.count()


# The first line of a puzzle file made from a notebook's cells (frontends/notebooks/cells.py). Such a file holds
# every code cell, the learner's experiments too (a tensor made to try a function out), so the tensors its import
# makes are the notebook's, not the answer's: they stay off the ledger, as in the notebook's own check cell.
NOTEBOOK_MARK = "as Run All runs them (generated for grading)"


def made_from_notebook(path) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return NOTEBOOK_MARK in f.readline()
    except (OSError, UnicodeDecodeError, TypeError):
        return False


class TargetError(Exception):
    """The learner's file could not be loaded (missing, a syntax error, an import that fails)."""


def load_module(path: Path):
    """Import one puzzle file as a fresh module (never a cached one: the learner may have edited it)."""
    if not path.exists():
        raise TargetError(f"there is no {path.name} in {path.parent}")
    name = f"_graded_{path.stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # a syntax error, a failing import, an exception at import time
        raise TargetError(f"{path.name} could not be imported: {describe_exception(exc, path)}") from exc
    return module


def check_entries(spec: PuzzleSpec, module) -> None:
    missing = [e for e in spec.entries if not hasattr(module, e)]
    if missing:
        raise TargetError(f"{spec.filename} defines no {', '.join(missing)}")


def load_puzzle(spec: PuzzleSpec, path: Path):
    """The learner's module for `spec`, or the PuzzleResult that says why there is none (a missing file: not
    attempted; one that does not import or lacks a function: an error). Call it inside spec.run_context()."""
    try:
        module = load_module(path)
        check_entries(spec, module)
        return module
    except TargetError as exc:
        status = NOT_ATTEMPTED if not path.exists() else ERROR
        return PuzzleResult(spec.id, spec.name, spec.title, status, error=str(exc))


def describe_exception(exc: BaseException, learner_file=None, puzzle: str = "") -> str:
    """'ValueError: boom' plus the learner's own frames (file:line: code), the simulator's note on the rank, and
    the likely cause when the error and its line (in `puzzle`, its id, if known) single one out (error_causes.py)."""
    head = without_machine_paths(f"{type(exc).__name__}: {exc}", learner_file)
    frames = traceback.extract_tb(exc.__traceback__)
    internal = (os.path.dirname(sim.__file__) + os.sep + "simulator", sim.__file__,
                os.path.dirname(os.path.dirname(traceback.__file__)), str(GRADER_DIR),
                os.path.dirname(importlib.util.__file__))
    mine = [f for f in frames if learner_file and os.path.abspath(f.filename) == os.path.abspath(str(learner_file))]
    if not mine:
        mine = [f for f in frames if not f.filename.startswith(internal) and "site-packages" not in f.filename]
    lines = [head] + [f"  at {os.path.basename(f.filename)}:{f.lineno} in {f.name}: {(f.line or '').strip()}"
                      for f in mine[-4:]]
    lines += list(getattr(exc, "__notes__", []))
    cause = likely_cause(exc, (mine[-1].line or "") if mine else "", puzzle)
    if cause:
        lines.append(f"likely cause: {cause}")
    return "\n".join(lines)


_PACKAGES = re.compile(r"[^\s'\"()]*[/\\](?:site|dist)-packages[/\\]")  # an installed package's folder


def without_machine_paths(text: str, learner_file=None) -> str:
    """`text` with the folders of this machine taken off the paths it names: the project's (an ImportError says
    "(/home/instructor/course/puzzles/model.py)"), the installed packages', the standard library's and the
    learner's own file's. What remains (puzzles/model.py, torch/__init__.py, p3_data_parallel.py) says the same
    to the learner, whose feedback must not carry the grading machine's paths."""
    folders = [str(GRADER_DIR.parent), os.path.dirname(os.__file__)]
    if learner_file is not None:
        folders.append(os.path.dirname(os.path.abspath(str(learner_file))))
    for folder in sorted((f.rstrip(os.sep) for f in folders), key=len, reverse=True):  # the deepest first
        if folder:  # never the root itself: that would take the first / off every path
            text = text.replace(folder + os.sep, "")
    return _PACKAGES.sub("", text)


# --------------------------------------------------------------------------------------------------------------
# One instance of the learner's module per simulated rank. Each real process imports the learner's file for
# itself, so a module-level queue, step counter, cache or tensor is per rank there; the simulator's ranks share
# one process, so each rank gets its own instance, made in the rank's own thread (sim.run's make_fn).


def load_module_for_rank(path: Path):
    """Rank r's own instance of the learner's file: imported afresh, as each real process imports it."""
    return load_module(path)


# IPython's own names in a notebook's globals (output history, input history, the shell): never the learner's state.
_IPYTHON_NAMES = re.compile(r"^(_|__|___|_i{1,3}|_i?\d+|_oh|_ih|_dh|In|Out|get_ipython|exit|quit)$")
_CONTAINERS = (list, dict, set, bytearray, collections.deque)  # defaultdict, OrderedDict, Counter: dict's kind


def namespace_copy_for_rank(module, entries):
    """Rank r's own instance of a module that has no file: the one the notebook's check cell builds from the
    notebook's globals. There is no source to import again, so this is the closest copy: the learner's functions
    are re-bound to a per-rank copy of the globals they see, in which module-level containers (list, dict, set,
    deque, ...), tensors and instances of the notebook's own classes are deep copies. So a queue, a cache, a
    counter (`global step; step += 1`) or a tensor at module level is per rank, as in separate processes.
    Shared still: objects of other modules' classes, state held in closures, and state that a class defined in
    the notebook keeps on itself (a class attribute)."""
    shared = next((getattr(module, e).__globals__ for e in entries
                   if isinstance(getattr(module, e, None), types.FunctionType)), None)
    if shared is None:  # nothing to re-bind: a shallow copy of the module is the best there is
        shared = module.__dict__
    home = shared.get("__name__")
    mine = {name: _rank_copy(value, home) if not name.startswith("__") and not _IPYTHON_NAMES.match(name)
            else value for name, value in shared.items()}
    rebound = {}  # id(the learner's function) -> the same function, seeing this rank's globals

    def mine_of(value):
        if isinstance(value, types.FunctionType) and value.__globals__ is shared:
            if id(value) not in rebound:
                rebound[id(value)] = _rebound(value, mine)
            return rebound[id(value)]
        return value

    for name, value in mine.items():
        mine[name] = mine_of(value)
    rank_module = types.ModuleType(getattr(module, "__name__", "learner"))
    rank_module.__dict__.update({name: mine[name] if name in mine and shared.get(name) is value else mine_of(value)
                                 for name, value in module.__dict__.items()})
    return rank_module


def _rank_copy(value, home):
    if not (isinstance(value, (*_CONTAINERS, torch.Tensor)) or getattr(type(value), "__module__", None) == home):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # a tensor in an autograd graph, an object that cannot be copied: it stays shared
        return value


def _rebound(fn: types.FunctionType, globals_: dict) -> types.FunctionType:
    """`fn` with its globals replaced (its code, defaults, closure and attributes kept)."""
    new = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__, new.__qualname__, new.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
    new.__dict__.update(fn.__dict__)
    new.__module__, new.__annotations__ = fn.__module__, dict(getattr(fn, "__annotations__", {}) or {})
    return new


# ---- how far along is a puzzle? (a NotImplementedError: not attempted, partly written, or the answer's own)

_STUB_MESSAGE = re.compile(r"^(p\d+): write (\S+)$")


def _body_is_only_a_raise(node: ast.AST) -> bool:
    """A function whose body (after its docstring) is just `raise NotImplementedError(...)`: an untouched stub."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _untouched(func) -> bool:
    """Is this function still its stub: a body that only raises NotImplementedError?"""
    import inspect
    import textwrap

    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]
        return _body_is_only_a_raise(node)
    except (OSError, TypeError, SyntaxError, IndexError):  # no source: read the bytecode instead
        code = func.__code__
        return set(code.co_names) <= {"NotImplementedError"} and any(
            isinstance(c, str) and _STUB_MESSAGE.match(c) for c in code.co_consts)


def _parts(spec: PuzzleSpec, module) -> dict[str, bool]:
    """{part: untouched?} for every function a learner writes in this puzzle: each entry that is a function, and
    each method of an entry that is a class (e.g. 'CopyToTensorParallel.backward')."""
    import inspect

    parts = {}
    for entry in spec.entries:
        value = getattr(module, entry, None)
        if inspect.isfunction(value):
            parts[entry] = _untouched(value)
        elif inspect.isclass(value):
            for name, member in vars(value).items():
                func = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if inspect.isfunction(func):
                    parts[f"{entry}.{name}"] = _untouched(func)
    return parts


def _parts_in_source(spec: PuzzleSpec, source: str) -> dict[str, bool]:
    """_parts from a file's text, without importing it (torchrun's rank 0 grades without running the file)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    parts = {}
    for node in tree.body:
        if getattr(node, "name", None) not in spec.entries:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts[node.name] = _body_is_only_a_raise(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    parts[f"{node.name}.{item.name}"] = _body_is_only_a_raise(item)
    return parts


def learner_source(module) -> str | None:
    """The source of the learner's puzzle: its file, or (a notebook's namespace) the source of its entries."""
    path = getattr(module, "__file__", None)
    if path and os.path.exists(path):
        with open(path) as f:
            return f.read()
    import inspect

    pieces = []
    own = {getattr(module, "__name__", None), "__main__"}  # defined in the notebook, not imported into it
    for value in vars(module).values():
        if (inspect.isfunction(value) or inspect.isclass(value)) and getattr(value, "__module__", None) in own:
            try:
                pieces.append(inspect.getsource(value))
            except (OSError, TypeError):
                continue
    return "\n\n".join(pieces) or None


def not_implemented_result(spec: PuzzleSpec, module, exc: NotImplementedError) -> PuzzleResult:
    """What a NotImplementedError out of a run means. Every part still an untouched stub: not attempted. Some
    parts written, some not (or a stub's `raise` left below written code): partial, naming what is left. A
    NotImplementedError that is not a stub's (the answer's own, or torch's 'not implemented for ...'): an error."""
    message = str(exc)
    match = _STUB_MESSAGE.match(message)
    learner_file = getattr(module, "__file__", None)
    if match is None or match.group(1) != spec.id:
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=describe_exception(exc, learner_file))
    parts = _parts(spec, module) or _parts_in_source(spec, learner_source(module) or "")
    left = [p for p, untouched in parts.items() if untouched]
    if parts and len(left) == len(parts):
        return PuzzleResult(spec.id, spec.name, spec.title, NOT_ATTEMPTED, error=f"not attempted ({message})")
    raising = match.group(2)
    said = []
    if left:
        said.append(f"still to write: {', '.join(left)}.")
    if raising not in left:  # written code above a stub's `raise` that the learner forgot to delete
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if learner_file and os.path.abspath(f.filename) == os.path.abspath(learner_file)]
        line = f" at line {frames[-1].lineno}" if frames else ""
        said.append(f"{raising} still raises NotImplementedError{line}, after your code: delete that `raise` line "
                    f"when the function is done.")
    return PuzzleResult(spec.id, spec.name, spec.title, PARTIAL,
                        error=f"partly written: {' '.join(said)} The puzzle is graded once every part runs.")
