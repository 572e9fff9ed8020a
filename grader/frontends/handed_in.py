"""What learners hand in, and where the work is in it: one set of rules for `batch` and for Gradescope's
run_autograder, so that a submission gets the same grade on both paths.

    find_work(folder)       one learner's folder or upload: the puzzle files at its top, a folder holding them
                            deeper (a whole checkout: its puzzles/), or a notebook; which one is graded when there
                            are several, and a flag for each choice a person should check
    lms_groups(files)       an LMS export (Canvas, Blackboard, ...): one folder of files named like
                            alice_1234_p3_data_parallel.py, grouped into one submission per learner
    notebook_has_work(nb)   whether a notebook's puzzle cells differ from those `build` wrote

The rules, which the learner's README states ("What to hand in"): the shallowest folder holding puzzle files
(at the same depth puzzles/, then by name) and the shallowest notebook (puzzles.ipynb first, one with work
before one as generated); the files win when any of them was edited (a stub as generated is not where the
learner worked), else the notebook. Anything else that holds work is named in a flag and in the note, never
graded in silence nor silently ignored; a folder with nothing to grade is an error that says what it holds,
never nineteen puzzles "not attempted".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..specs import SPECS
from .stubs import digest, learner_edited

SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", "node_modules", ".git", ".venv", "venv", "site-packages"}
MAX_ENTRIES = 5000  # what the search looks at in one submission (a learner's folder is small; a venv is not)
PUZZLE_FILES = {spec.filename for spec in SPECS.values()}


@dataclass
class Work:
    """Where one learner's work is: `path` a folder whose top holds the puzzle files, or a notebook; None when
    there is nothing to grade (`note` says what there is instead)."""

    path: Path | None
    note: str  # for the learner and the instructor: what was graded, what was not
    flags: list[str] = field(default_factory=list)  # for a person to check: what was ambiguous


def walk(folder: Path, depth: int = 4):
    """(folder, its files) under `folder`, shallowest first, skipping hidden folders, caches, virtual
    environments and every symbolic link (an uploaded link to / must not send the search through the whole
    disk), at most MAX_ENTRIES entries in all."""
    level, seen = [folder], 0
    for _ in range(depth + 1):
        deeper = []
        for d in level:
            try:
                entries = [e for e in sorted(d.iterdir()) if not e.is_symlink()]
            except OSError:
                continue
            seen += len(entries)
            if seen > MAX_ENTRIES:
                return
            yield d, [e for e in entries if e.is_file()]
            deeper += [e for e in entries if e.is_dir() and not e.name.startswith(".") and e.name not in SKIPPED_DIRS]
        level = deeper


def files_edited(folder: Path) -> bool:
    """Whether any puzzle file at the top of `folder` is not a stub as `build` wrote it."""
    return any(learner_edited(path.read_text(errors="replace")) for name in sorted(PUZZLE_FILES)
               if (path := folder / name).is_file())


def notebook_has_work(path: Path) -> bool:
    """Whether any puzzle cell of the notebook differs from what `build` wrote (the digests it recorded in the
    notebook's metadata). A notebook without that record, or one that does not read, may hold work: True."""
    try:
        nb = json.loads(path.read_text(errors="replace"))
        recorded = nb.get("metadata", {}).get("puzzles", {}).get("cells", {})
        cells = [c for c in nb.get("cells", []) if c.get("id") in SPECS]
    except (OSError, ValueError, AttributeError):
        return True
    if not recorded or not cells:
        return True
    source = lambda cell: "".join(cell["source"]) if isinstance(cell.get("source"), list) else cell.get("source", "")
    return any(digest(source(c)) != recorded.get(c["id"]) for c in cells)


def attempted_code(files: dict[str, Path] | None, notebook: Path | None) -> dict[str, str]:
    """{puzzle id: the learner's code for it} for each puzzle they attempted (a stub as generated, or a notebook
    cell as generated, is left out): what batch --similarity compares."""
    out = {}
    if files is not None:
        for spec in SPECS.values():
            path = files.get(spec.filename)
            if path is not None and path.is_file() and not path.is_symlink():
                text = path.read_text(errors="replace")
                if learner_edited(text):
                    out[spec.id] = text
        return out
    try:
        nb = json.loads(notebook.read_text(errors="replace"))
    except (OSError, ValueError):
        return out
    recorded = nb.get("metadata", {}).get("puzzles", {}).get("cells", {})
    for cell in nb.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", [])
        puzzle = next((t for t in tags if t in SPECS), cell.get("id") if cell.get("id") in SPECS else None)
        if cell.get("cell_type") != "code" or puzzle is None:
            continue
        source = "".join(cell["source"]) if isinstance(cell.get("source"), list) else cell.get("source", "")
        if digest(source) != recorded.get(cell.get("id")):
            out[puzzle] = out.get(puzzle, "") + source + "\n"
    return out


def shown(path: Path, folder: Path) -> str:
    rel = path.relative_to(folder)
    if rel == Path("."):
        return "the files at the top of the submission"
    return f"{rel.as_posix()}{'/' if path.is_dir() else ''}"


def find_work(folder: Path) -> Work:
    """Where the work is in one learner's `folder` (the rules: this module's docstring)."""
    folders, notebooks = [], []
    for d, files in walk(folder):
        if any(f.name in PUZZLE_FILES for f in files):
            folders.append(d)
        notebooks += [f for f in files if f.suffix == ".ipynb"]
    if not folders and not notebooks:
        entries = sorted(e.name + ("/" if e.is_dir() else "") for e in folder.iterdir() if not e.name.startswith("."))
        held = f"it holds {', '.join(entries[:6])}{', ...' if len(entries) > 6 else ''}" if entries else "it is empty"
        return Work(None, f"no puzzle file (p1_checkpointing.py, ...) and no notebook (*.ipynb) was found: {held}")

    def first(paths):  # the shallowest; at the same depth puzzles/ or puzzles.ipynb, then by name
        return min(paths, key=lambda p: (len(p.relative_to(folder).parts), p.stem != "puzzles", str(p)))

    # The first folder in that order, never the one that merely holds edited files: a clone of the course's
    # repository holds solutions/ beside the learner's puzzles/, and must be graded from puzzles/ (or the notebook).
    files = first(folders) if folders else None
    worked = [d for d in folders if files_edited(d)]
    notebooks_worked = [n for n in notebooks if notebook_has_work(n)]
    notebook = first(notebooks_worked or notebooks) if notebooks else None
    chosen = files if files is not None and (files in worked or notebook is None) else notebook
    note, flags = f"Graded {shown(chosen, folder)}", []
    others = [p for p in worked + notebooks_worked if p != chosen]
    if others:
        listed = ", ".join(shown(p, folder) for p in others)
        note += f"; {listed} also held work and {'were' if len(others) > 1 else 'was'} not graded"
        flags.append(f"more than one place holds work: graded {shown(chosen, folder)}, not {listed}")
    elif files is not None and notebook is not None:
        other = notebook if chosen == files else files
        note += f"; {shown(other, folder)} was also handed in, as generated, and was not graded"
    return Work(chosen, note + ".", flags)


# ---- LMS exports: one folder of every learner's files, each name prefixed with who handed it in

# alice_1234_p3_data_parallel.py; lastfirst_LATE_12345_67890_p3_data_parallel-1.py (Canvas: a late file, the second
# version of a file, a number per file after the learner's); Assignment_bob_attempt_2024-05-01-10-00-00_p3_...py
_SEPARATOR = re.compile(r"[_\- ]+")
_VERSION = re.compile(r"^(?P<base>.*?)-(?P<version>\d+)$")


@dataclass
class LmsGroup:
    """One learner's files in an LMS export: `files` maps the name each gets in the copy to the file."""

    name: str
    files: dict[str, Path] = field(default_factory=dict)
    notebooks: list[Path] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def learner_key(words: list[str]) -> tuple[str, int] | None:
    """(the learner, how many words name them) in a file name's words: up to the first number (Canvas puts a
    number per file after the learner's id), without Canvas's LATE mark. None without a number."""
    kept = []
    for i, word in enumerate(words):
        if word.upper() != "LATE":
            kept.append(word)
        if word.isdigit() and i > 0:
            return "_".join(kept), i + 1
    return None


def split_lms_name(name: str) -> tuple[str, str, int] | None:
    """(learner, the file's own name, its version) for a file named like an LMS export's; None otherwise."""
    path = Path(name)
    if path.suffix not in (".py", ".ipynb"):
        return None
    m = _VERSION.match(path.stem)
    base, version = (m.group("base"), int(m.group("version"))) if m else (path.stem, 0)
    for filename in PUZZLE_FILES:  # a puzzle file: its learner is everything before its name
        stem = filename[:-3]
        if path.suffix == ".py" and base.endswith(stem) and len(base) > len(stem) and base[-len(stem) - 1] in "_- ":
            who = [w for w in _SEPARATOR.split(base[: -len(stem) - 1]) if w]
            key = learner_key(who)
            return (key[0] if key else "_".join(w for w in who if w.upper() != "LATE")), filename, version
    words = [w for w in _SEPARATOR.split(base) if w]
    key = learner_key(words)
    if key is None:
        return None
    rest = words[key[1]:]
    while rest and rest[0].isdigit():  # Canvas's number for the file
        rest = rest[1:]
    return (key[0], "_".join(rest) + path.suffix, version) if rest else None


def lms_groups(files: list[Path]) -> tuple[list[LmsGroup], list[Path]]:
    """(one group per learner, the files that are no learner's puzzle file or notebook). A group must hold a
    puzzle file; a notebook joins the group of its learner, or is a submission of its own."""
    named = [(f, parts) for f in files if (parts := split_lms_name(f.name)) is not None]
    groups: dict[str, LmsGroup] = {}
    versions: dict[tuple[str, str], list[tuple[int, Path]]] = {}
    for f, (who, own, version) in named:
        if own in PUZZLE_FILES:
            groups.setdefault(who, LmsGroup(who))
            versions.setdefault((who, own), []).append((version, f))
    rest = []
    for f in files:
        parts = split_lms_name(f.name)
        if parts is None or parts[0] not in groups:
            rest.append(f)
        elif parts[1].endswith(".ipynb"):
            groups[parts[0]].notebooks.append(f)
        elif parts[1] not in PUZZLE_FILES and parts[1].endswith(".py"):  # a helper module of the learner's
            groups[parts[0]].files.setdefault(parts[1], f)
    for (who, own), found in sorted(versions.items()):
        found.sort(key=lambda vf: (vf[0], vf[1].stat().st_mtime, vf[1].name))
        groups[who].files[own] = found[-1][1]
        if len(found) > 1:
            groups[who].flags.append(f"{len(found)} versions of {own} ({', '.join(f.name for _, f in found)}): "
                                     f"graded the last, {found[-1][1].name}")
    return [groups[k] for k in sorted(groups)], rest
