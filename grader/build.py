"""`python -m grader build`: the learner's files, generated from the reference solutions.

`solutions/pN_*.py` is the single source. Each region between a `# BEGIN SOLUTION` line and an
`# END SOLUTION` line (the nbgrader convention) becomes one `raise NotImplementedError(...)` line in the
stub `puzzles/pN_*.py`; everything else (the story, the signature, the imports) is copied as is.

Each stub records a digest of its own body, so that `--check` can tell a stale stub (generated from an older
solution: an error) from one the learner has been editing (left alone).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import nbformat

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
HEADER = ("# Generated from solutions/{name} by `python -m grader build`: fill in the code marked "
          "NotImplementedError, then run `python -m grader`. (stub digest {digest})\n")
_DIGEST = re.compile(r"\(stub digest ([0-9a-f]{12})\)")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)")


class BuildError(Exception):
    pass


def stub_body(source: str, name: str) -> str:
    """The solution with every solution region replaced by a NotImplementedError naming what to write
    ("p4: write CopyToTensorParallel.backward")."""
    out, inside, current = [], False, None
    scopes: list[tuple[int, str]] = []  # (indent, name) of the enclosing defs and classes
    puzzle = name.split("_", 1)[0]
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        mark = line.strip()
        if not inside:
            m = _DEF.match(line)
            if m:
                indent = len(line) - len(line.lstrip())
                scopes = [(i, n) for i, n in scopes if i < indent] + [(indent, m.group(1))]
                current = ".".join(n for _, n in scopes)
        if mark == BEGIN:
            if inside:
                raise BuildError(f"{name}:{number}: {BEGIN} inside another solution region")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f'{indent}raise NotImplementedError("{puzzle}: write {current}")\n')
        elif mark == END:
            if not inside:
                raise BuildError(f"{name}:{number}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise BuildError(f"{name}: {BEGIN} is never closed")
    return "".join(out)


def digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def stub(source: str, name: str) -> str:
    body = stub_body(source, name)
    return HEADER.format(name=name, digest=digest(body)) + body


def learner_edited(text: str) -> bool:
    """True when a generated stub no longer matches the digest it was written with."""
    first, _, body = text.partition("\n")
    m = _DIGEST.search(first)
    return m is None or digest(body) != m.group(1)


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
    from .notebook import build_notebook

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
