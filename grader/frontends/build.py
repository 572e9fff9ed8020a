"""`python -m grader build`: the learner's files, generated from the reference solutions.

`solutions/pN_*.py` is the single source. Each region between a `# BEGIN SOLUTION` line and an
`# END SOLUTION` line (the nbgrader convention, stubs.py) becomes one `raise NotImplementedError(...)` line in the
stub `puzzles/pN_*.py`; everything else (the story, the signature, the imports) is copied as is. The notebooks'
cells come from the same files (notebooks/file.py): puzzles.ipynb and puzzles-standalone.ipynb.

`build` never overwrites a learner's work: a stub whose body no longer matches the digest it was written with,
and a notebook cell whose source no longer matches the digest recorded for it, are left alone and named
(`--force` overwrites them: for instructors). Cells a learner added to a notebook are kept where they are, and so
are the outputs of cells that do not change. `--check` reports what `build` would write, with the same
exceptions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .notebooks.file import NOTEBOOK, STANDALONE_NOTEBOOK, build_notebook
from .notebooks.standalone import recorded_digest
from .stubs import digest, learner_edited, stub

ROLES = {"intro": "the introduction", "install": "the install cell", "setup": "the setup cell",
         "tour-text": "the tour's text", "tour-code": "the tour's code cell"}
OLDER_LAYOUT = "*"  # merge_notebook's word for "the whole notebook": edited, and written before cells had role ids


def planned_files(root: Path) -> dict[Path, str]:
    """Every generated stub and the text `build` would write to it."""
    files = {}
    for solution in sorted((root / "solutions").glob("p*_*.py")):
        files[root / "puzzles" / solution.name] = stub(solution.read_text(), solution.name)
    return files


@dataclass
class Plan:
    """What `build` does to the generated files."""

    write: dict[Path, str] = field(default_factory=dict)  # path -> the text to write
    kept: list[str] = field(default_factory=list)  # what a learner edited, left alone (one line each)


def _describe(cell_id: str) -> str:
    if cell_id in ROLES:
        return ROLES[cell_id]
    puzzle, _, part = cell_id.partition("-")
    return {"": f"the {puzzle} code cell (your answer)", "story": f"the {puzzle} story",
            "check": f"the {puzzle} check cell"}.get(part, f"cell {cell_id}")


def _key(cell) -> str:
    """What a generated cell is, for comparing: its source (for the setup cell, the digest of what it carries)."""
    return recorded_digest(cell.source) or cell.source


def _tags(cell) -> list:
    return list(cell.get("metadata", {}).get("tags", []))


def merge_notebook(current, fresh, force: bool = False) -> tuple[object, bool, list[str]]:
    """(the notebook to write, whether it differs from `current`, the ids of the edited cells left alone).

    Cells are matched by id. A generated cell whose source still has the digest recorded when it was written is
    replaced by its fresh version (keeping its outputs when the source is the same); an edited one is kept. Cells
    the learner added stay after the generated cell they followed."""
    recorded = current.metadata.get("puzzles", {}).get("cells", {})
    by_id = {c.get("id"): c for c in current.cells}
    fresh_ids = [c["id"] for c in fresh.cells]
    if not set(fresh_ids) & set(by_id):  # written by an older build, before cells had role ids
        old = current.metadata.get("puzzles", {}).get("cells_digest")
        cells = [(c.cell_type, c.source, _tags(c)) for c in current.cells]
        unedited = old is not None and old == digest(json.dumps(cells))
        return (fresh, True, []) if unedited or force else (current, False, [OLDER_LAYOUT])
    followers: dict = {}  # the id of the generated cell each learner cell follows -> those cells
    previous = None
    for cell in current.cells:
        cid = cell.get("id")
        if cid in by_id and cid in fresh_ids:
            previous = cid
        elif not (cid in recorded and digest(_key(cell)) == recorded[cid]):  # an obsolete generated cell: dropped
            followers.setdefault(previous, []).append(cell)
    cells, kept, changed = list(followers.get(None, [])), [], False
    for new in fresh.cells:
        old = by_id.get(new["id"])
        if old is not None and old.cell_type == new.cell_type and _key(old) == _key(new):
            if _tags(old) != _tags(new):
                old.metadata["tags"] = _tags(new)
                changed = True
            cells.append(old)  # unchanged: its outputs stay
        elif old is not None and not force and digest(_key(old)) != recorded.get(new["id"]):
            cells.append(old)
            kept.append(new["id"])
        else:
            cells.append(new)
            changed = True
        cells += followers.get(new["id"], [])
    changed = changed or [c.get("id") for c in cells] != [c.get("id") for c in current.cells]
    merged = nbformat.v4.new_notebook(cells=cells, metadata=fresh.metadata)
    return merged, changed, kept


def _with_record(nb):
    """The notebook with the digest of each generated cell recorded, so that a later build can tell the cells a
    learner edited."""
    nb.metadata["puzzles"] = {"generated_from": "solutions/",
                              "cells": {c["id"]: digest(_key(c)) for c in nb.cells}}
    return nb


def notebook_text(nb) -> str:
    return nbformat.writes(nb) + "\n"


def fresh_notebook(root: Path, standalone: bool = False):
    """The notebook as `build` makes it from solutions/, with its cells' digests recorded."""
    return _with_record(build_notebook(root, standalone=standalone))


def plan(root: Path, force: bool = False) -> Plan:
    out = Plan()
    for path, text in planned_files(root).items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if current is not None and learner_edited(current) and not force:
            out.kept.append(f"left {path.relative_to(root)} alone: you have edited it")
            continue
        out.write[path] = text
    for name, standalone in ((NOTEBOOK, False), (STANDALONE_NOTEBOOK, True)):
        path = root / name
        fresh = fresh_notebook(root, standalone)
        if not path.exists() or force:
            out.write[path] = notebook_text(fresh)
            continue
        merged, changed, kept = merge_notebook(nbformat.reads(path.read_text(), as_version=4), fresh)
        if changed:
            out.write[path] = notebook_text(merged)
        out.kept += [f"left {name} alone: you have edited it, and an older build wrote it" if cid == OLDER_LAYOUT
                     else f"left {_describe(cid)} of {name} alone: you have edited it" for cid in kept]
    return out


def build(root: Path, force: bool = False) -> Plan:
    """Write what changed; return the plan (what was written, what was left alone)."""
    result = plan(root, force)
    for path, text in result.write.items():
        path.write_text(text)
    return result


def stale(root: Path) -> list[str]:
    """What `build` would change, leaving alone the stubs and the notebook cells a learner has edited."""
    return [f"{path.relative_to(root)} is {'stale' if path.exists() else 'missing'}: run `python -m grader build`"
            for path in plan(root).write]
