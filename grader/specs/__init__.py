"""The puzzles' specs: one package per puzzle, each exporting `SPEC` (a core.spec.PuzzleSpec).

    pN_<name>/           one puzzle in one place: __init__.py (its map, and SPEC), spec.py (inputs from a seed, the
                         serial reference, what each rank runs, the budgets as formulas with their numbers, the checks
                         and their diagnoses), and beside it, where they are separate, its layout and serial truth,
                         costs, checks, memory rules, watches and diagnoses
    common/              what several puzzles share (its map says which use what): the model's costs on the clock,
                         the pipeline spec and its values (p5, p6, p16, p17), what an optimizer keeps (p8, p9, p19)

A puzzle that is a variant of an earlier one imports that puzzle's package by name, and its map says so: p2 builds
on p1, p7 on p3, p17 on p6, p18 on p9. The predictor (`grader predict`) is not a puzzle: it lives in
grader/predictor/.

A spec sees the learner's code only through `program` (run on the ranks by a backend) and grades plain data
(an Observation). Specs import core/ and puzzles/ only. Adding a puzzle is adding a package here (pN_<name>/ with
__init__.py and spec.py) and a solution (docs/development.md, "Adding a puzzle").
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from ..core.spec import PuzzleSpec


def _discover() -> dict[str, PuzzleSpec]:
    specs = []
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg and re.match(r"p\d+_", info.name):  # pN_name/; what several puzzles share is in common/
            specs.append(importlib.import_module(f"{__name__}.{info.name}").SPEC)
    specs.sort(key=lambda s: (int(re.match(r"p(\d+)", s.id).group(1)), s.id))
    return {s.id: s for s in specs}


SPECS = _discover()


def select(puzzle_ids=None) -> list[PuzzleSpec]:
    """The specs of `puzzle_ids` (all of them when empty), in the order given."""
    if not puzzle_ids:
        return list(SPECS.values())
    unknown = [p for p in puzzle_ids if p not in SPECS]
    if unknown:
        raise KeyError(f"unknown puzzle(s) {unknown}; known: {list(SPECS)}")
    return [SPECS[p] for p in puzzle_ids]
