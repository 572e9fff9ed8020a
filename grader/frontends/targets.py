"""What the front ends grade: a folder laid out like puzzles/, or a notebook, on the simulator or on real
torch.distributed processes. `grade_target` is the one call the CLI, pytest and the tests make."""

from __future__ import annotations

import os
from pathlib import Path

from ..backends import simulator
from ..core.result import PuzzleResult
from ..specs import select

REPO = Path(__file__).resolve().parent.parent.parent  # the project's folder (puzzles/, solutions/ live here)


def resolve_target(target: str | os.PathLike) -> Path:
    """'puzzles' and 'solutions' name this project's folders wherever it is run from; anything else is a path."""
    path = Path(target)
    if path.exists():
        return path
    if str(target) in ("puzzles", "solutions") and (REPO / str(target)).exists():
        return REPO / str(target)
    raise FileNotFoundError(f"no such target: {target} (give 'puzzles', 'solutions', a folder laid out like "
                            f"puzzles/, or a notebook such as puzzles.ipynb)")


def grade_target(target, puzzle_ids=None, seed: int = 0, backend: str = "sim", **real_options) -> list[PuzzleResult]:
    """Grade every puzzle (or those in `puzzle_ids`) of a folder laid out like puzzles/ or of a notebook. backend
    "sim" (the simulator) or "torch" (real processes on torch.distributed: see backends/real, which takes
    `real_options`)."""
    path = resolve_target(target)
    if backend == "sim":
        grade = lambda folder, specs: simulator.grade_folder(folder, specs, seed)  # noqa: E731
    elif backend == "torch":
        from ..backends import real

        grade = lambda folder, specs: real.grade_folder(folder, specs, seed, **real_options)  # noqa: E731
    else:
        raise KeyError(f"unknown backend {backend!r}: 'sim' or 'torch'")
    if path.suffix == ".ipynb":
        from .notebook_file import notebook_target

        with notebook_target(path) as folder:
            return grade(folder, select(puzzle_ids))
    return grade(path, select(puzzle_ids))
