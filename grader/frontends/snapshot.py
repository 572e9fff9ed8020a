"""A fingerprint of the grader's and the simulator's code, taken in the zygote before any learner's code has run
and compared after each puzzle, in the puzzle's own process.

A learner's file that replaces a function, a method, a class attribute, a spec's cost model or one of its numbers
in `grader.*` or `puzzles.*` (or a method of `torch.Tensor`, which the ledger counts through) changes what the
simulator measures. The batch names each change in the row's flags and grades the puzzle as an error, never a pass.

What it cannot see: a running world's own data changed from inside the run, or memory written through ctypes.
The in-process detector (`tamper_report`, the verdict-integrity work) covers the first; the second is the threat
model's residual risk (README, "Grading for credit").
"""

from __future__ import annotations

import sys

import torch

_PACKAGES = ("grader", "puzzles")
_ATOMS = (int, float, str, bytes, bool, type(None))
_CLASSES = (torch.Tensor, torch.UntypedStorage)
_FRONTENDS = {f"grader.frontends.{m}" for m in ("runner", "snapshot", "sandbox", "tamper_hook", "zygote")}
_IGNORED = {"__warningregistry__"}  # the warnings module's bookkeeping: a warning raised in a module adds it


def _ours(obj) -> bool:
    return str(getattr(type(obj), "__module__", "")).startswith(_PACKAGES)


def _value(v):
    return ("=", v) if isinstance(v, _ATOMS) else ("id", id(v))


def _walk(prefix: str, obj, out: dict, depth: int) -> None:
    """Each attribute of obj by identity (numbers and strings by value); into classes, our instances and the
    containers that hold them, `depth` levels deep. The set of names of a class or an instance is kept too: a
    method added to a class (a `__getattribute__`, a property) or an attribute that shadows a class's on an
    instance (`spec.cost = ...`) changes it as much as one replaced."""
    if isinstance(obj, type):
        items = list(vars(obj).items())
        out[f"{prefix}.__names__"] = ("names", frozenset(name for name, _ in items if name not in _IGNORED))
    elif isinstance(obj, dict):
        items = [(repr(k), v) for k, v in list(obj.items()) if isinstance(k, (str, int))]
    elif isinstance(obj, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).items())
        out[f"{prefix}.__names__"] = ("names", frozenset(n for n, _ in items if n not in _IGNORED))  # `spec.cost =`
    else:
        return
    items = [(name, value) for name, value in items if name not in _IGNORED]
    for name, value in items:
        key = f"{prefix}.{name}"
        out[key] = _value(value)
        if depth > 0 and (isinstance(value, type) and str(value.__module__).startswith(_PACKAGES)
                          or _ours(value) or isinstance(value, (dict, list, tuple)) and len(value) < 64):
            _walk(key, value, out, depth - 1)


def take() -> dict:
    """{dotted name: fingerprint} of every module of the grader and the simulator loaded now."""
    out: dict = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in _PACKAGES or name.startswith("puzzles.p") or (
                name.startswith("grader.frontends.") and name not in _FRONTENDS):
            continue  # puzzles.pN_* are learner files; the front ends' other modules take no part in a puzzle run
        out[name] = ("id", id(module))
        _walk(name, module, out, 2)
    for cls in _CLASSES:
        _walk(f"{cls.__module__}.{cls.__qualname__}", cls, out, 0)
    return out


def changes(before: dict, after: dict) -> list[str]:
    """What differs, by name: 'puzzles.simulator.memory.Ledger.peak_by_line was replaced', '... was removed'."""
    found = []
    for key, old in before.items():
        new = after.get(key)
        if new is None:
            found.append(f"{key} was removed")
        elif new == old:
            continue
        elif old[0] == "names":
            owner = key.rsplit(".", 1)[0]
            found += [f"{owner}.{n} was added" for n in sorted(new[1] - old[1])]
        elif old[0] == "id":
            found.append(f"{key} was replaced")
        else:
            found.append(f"{key} was changed from {old[1]!r} to {new[1]!r}")
    return found
