"""Loading the learner's puzzle file, and describing what went wrong in it, for every backend."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import traceback
from pathlib import Path

from puzzles import sim

from ..core.result import ERROR, NOT_ATTEMPTED, PuzzleResult
from ..core.spec import PuzzleSpec

GRADER_DIR = Path(__file__).resolve().parent.parent
HARNESS_FILES = tuple(str(p) for p in GRADER_DIR.rglob("*.py"))  # the grader's own code: its lines are "[harness]"
_counter = itertools.count()


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


def describe_exception(exc: BaseException, learner_file=None) -> str:
    """'ValueError: boom' plus the learner's own frames (file:line: code), and the simulator's note on the rank."""
    head = f"{type(exc).__name__}: {exc}"
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
    return "\n".join(lines)
