"""What the front ends grade: a folder laid out like puzzles/, one puzzle file, or a notebook, on the simulator or
on real torch.distributed processes. `grade_target` is the one call the CLI, pytest and the tests make.

'puzzles' means ./puzzles when there is one, else the checkout's puzzles/ (when the grader runs from a checkout
of the project); 'solutions' likewise. An installed package has no checkout: outside one, a name that is not a
path here is an error that says what to give instead. A folder that holds none of the puzzle files is an error
too (a mistyped folder must not read as "8 not attempted").
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

from ..backends import simulator
from ..core.result import PuzzleResult
from ..specs import SPECS, select
from . import guards

REPO = Path(__file__).resolve().parent.parent.parent  # the project's folder (puzzles/, solutions/ live here)


def in_checkout() -> bool:
    """True when this grader runs from a checkout of the project (not from an installed package)."""
    return (REPO / "pyproject.toml").is_file() and (REPO / "solutions").is_dir()


def normalize_puzzle_id(word: str) -> str | None:
    """'p3', 'P3' and '3' -> 'p3'; None for a word that is no puzzle id."""
    m = re.fullmatch(r"[pP]?(\d+)", word.strip())
    return f"p{int(m.group(1))}" if m else None


def resolve_target(target: str | os.PathLike) -> Path:
    """The path to grade: `target` itself when it exists; 'puzzles' and 'solutions' name the checkout's folders
    wherever it is run from."""
    path = Path(target)
    if path.exists():
        return path
    name = str(target)
    if name in ("puzzles", "solutions") and in_checkout() and (REPO / name).exists():
        return REPO / name
    if name == "puzzles":
        raise FileNotFoundError(
            f"there is no folder 'puzzles' in {Path.cwd()}, and this grader is an installed package, not a "
            f"checkout of the project: run it in the folder that holds your puzzles/ (the pN_*.py files), or name "
            f"what to grade: `python -m grader check FOLDER` or `python -m grader check NOTEBOOK.ipynb`")
    if name == "solutions":
        raise FileNotFoundError("the reference solutions come with a checkout of the project (its solutions/), and "
                                "this grader is an installed package: give the path of a folder of solutions")
    raise FileNotFoundError(f"no such target: {target} (give 'puzzles', 'solutions', a folder laid out like "
                            f"puzzles/, or a notebook such as puzzles.ipynb)")


def _holds_puzzles(folder: Path) -> None:
    """A folder with none of the puzzle files is a mistake (a typo, the wrong level), not 8 puzzles not attempted."""
    if any((folder / spec.filename).exists() for spec in SPECS.values()):
        return
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir() if not p.name.startswith("."))
    held = f"it holds {', '.join(entries[:6])}{', ...' if len(entries) > 6 else ''}" if entries else "it is empty"
    raise FileNotFoundError(f"{folder} holds no puzzle file ({', '.join(s.filename for s in SPECS.values())}); "
                            f"{held}. Give the folder that holds your pN_*.py files, or a notebook")


def check_target(target) -> str | None:
    """Refuse now what grade_target would refuse before grading anything (no such target, a folder with no puzzle
    file, a file that is neither a puzzle file nor a notebook that reads), with the same errors; return the id of
    the puzzle a puzzle file holds (None for a folder or a notebook). pytest's --target is one usage error so."""
    path = resolve_target(target)
    if path.suffix == ".ipynb":
        from .notebooks.cells import learner_cells, read_notebook

        learner_cells(read_notebook(path))  # NotebookError
        return None
    if path.is_file():
        return _puzzle_file(path).id
    _holds_puzzles(path)
    return None


def _puzzle_file(path: Path):
    spec = next((s for s in SPECS.values() if s.filename == path.name), None)
    if spec is None:
        raise FileNotFoundError(f"{path} is not a puzzle file (p1_checkpointing.py, ...), a folder or a notebook")
    return spec


def grade_target(target, puzzle_ids=None, seed: int = 0, backend: str = "sim", notes: list | None = None,
                 **options) -> list[PuzzleResult]:
    """Grade every puzzle (or those in `puzzle_ids`) of a folder laid out like puzzles/, of one puzzle file, or
    of a notebook. backend "sim" (the simulator; `timeout=` seconds a rank may compute without communicating)
    or "torch" (real processes on torch.distributed: see backends/real, which takes `options`). What was
    recovered or left out of a notebook is appended to `notes`."""
    if backend not in ("sim", "torch"):
        raise KeyError(f"unknown backend {backend!r}: 'sim' or 'torch'")
    path = resolve_target(target)
    if path.suffix == ".ipynb":
        from .notebooks.cells import notebook_target

        target = notebook_target(path)
        with target as folder:
            results = _grade_folder(folder, select(puzzle_ids), seed, backend, options)
        if notes is not None:
            notes.extend(f"{path.name}: {note}" for note in target.extracted.notes)
        return [target.extracted.relocate(r) for r in results]
    if path.is_file():
        spec = _puzzle_file(path)
        ids = puzzle_ids or [spec.id]
        if ids != [spec.id]:
            raise KeyError(f"{path.name} holds {spec.id} only, not {', '.join(i for i in ids if i != spec.id)}")
        return _grade_folder(path.parent, [spec], seed, backend, options)
    _holds_puzzles(path)
    return _grade_folder(path, select(puzzle_ids), seed, backend, options)


def _grade_folder(folder: Path, specs, seed: int, backend: str, options: dict) -> list[PuzzleResult]:
    broken = {s.id: r for s in specs if (r := guards.syntax_error(s, folder / s.filename)) is not None}
    todo = [s for s in specs if s.id not in broken]
    if backend == "torch":  # each rank in its own process: an exit there ends that rank, and the group reports it
        from ..backends import real

        graded = {r.id: r for r in real.grade_folder(folder, todo, seed, **options)} if todo else {}
        size = options.get("world_size")
        specs = [s for s in specs if s.id in graded or s.id in broken and size in (None, s.world_size)]
    else:
        graded = {s.id: _grade_in_process(folder, s, seed, options.get("timeout")) for s in todo}
    return [guards.advise(broken.get(s.id) or graded[s.id]) for s in specs]


def _grade_in_process(folder: Path, spec, seed: int, timeout: float | None) -> PuzzleResult:
    """One puzzle on the simulator, in this process: sys.exit() and os._exit() in the learner's code end that
    puzzle with an error, never the grader."""
    if timeout is not None:
        spec = copy.copy(spec)
        spec.timeout = timeout
    try:
        with guards.no_exit():
            return simulator.grade_file(spec, folder / spec.filename, seed)
    except SystemExit as exc:
        return guards.exit_result(spec, exc, folder / spec.filename)
