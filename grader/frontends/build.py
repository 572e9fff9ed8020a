"""`python -m grader build`: the learner's files, generated from the reference solutions.

`solutions/pN_*.py` is the single source. Each region between a `# BEGIN SOLUTION` line and an
`# END SOLUTION` line (the nbgrader convention, stubs.py) becomes one `raise NotImplementedError(...)` line in the
stub `puzzles/pN_*.py`; everything else (the story, the signature, the imports) is copied as is. The notebook's
cells come from the same files (notebook_file.py).

Each stub records a digest of its own body, so that `--check` can tell a stale stub (generated from an older
solution: an error) from one the learner has been editing (left alone).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

from .notebook_file import build_notebook
from .stubs import digest, learner_edited, stub


def planned_files(root: Path) -> dict[Path, str]:
    """Every generated file and the text `build` would write to it."""
    files = {}
    for solution in sorted((root / "solutions").glob("p*_*.py")):
        files[root / "puzzles" / solution.name] = stub(solution.read_text(), solution.name)
    return files


NOTEBOOK = "puzzles.ipynb"


def cells_digest(nb) -> str:
    """A digest of a notebook's cell sources and tags (not its outputs: running a notebook does not edit it)."""
    cells = [(c.cell_type, c.source, c.get("metadata", {}).get("tags", [])) for c in nb.cells]
    return digest(json.dumps(cells))


def notebook_text(root: Path) -> str:
    nb = build_notebook(root)
    nb.metadata["puzzles"] = {"generated_from": "solutions/", "cells_digest": cells_digest(nb)}
    return nbformat.writes(nb) + "\n"


def build(root: Path) -> list[Path]:
    written = []
    planned = planned_files(root)
    planned[root / NOTEBOOK] = notebook_text(root)
    for path, text in planned.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def stale(root: Path) -> list[str]:
    """What `build` would change, leaving alone the stubs and the notebook cells a learner has edited."""
    problems = []
    for path, text in planned_files(root).items():
        if not path.exists():
            problems.append(f"{path.relative_to(root)} is missing")
            continue
        current = path.read_text()
        if current != text and not learner_edited(current):
            problems.append(f"{path.relative_to(root)} is stale: run `python -m grader build`")
    path = root / NOTEBOOK
    if not path.exists():
        problems.append(f"{NOTEBOOK} is missing")
    else:
        current = nbformat.reads(path.read_text(), as_version=4)
        fresh = nbformat.reads(notebook_text(root), as_version=4)
        recorded = current.metadata.get("puzzles", {}).get("cells_digest")
        unedited = recorded == cells_digest(current)
        if unedited and cells_digest(current) != cells_digest(fresh):
            problems.append(f"{NOTEBOOK} is stale: run `python -m grader build`")
    return problems
