"""What SUBMISSIONS holds, as one Submission per learner, and the private copy of each that a jail grades.

    submissions_in(folder)   the Submissions, in the folder's order: a notebook; a folder (its puzzle files, a
                             whole checkout's puzzles/, or its notebook: ../handed_in.py's rules, the same as
                             Gradescope's); an LMS export's files, one group per learner; anything else a row
                             that says why it was not graded
    private_copy(...)        copy what will be graded into the parent's own folder: regular files only, bounded

The parent reads a learner's files as data only (names, sizes, a notebook's JSON): it never imports them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..handed_in import PUZZLE_FILES, find_work, lms_groups, notebook_has_work, shown
from ..stubs import learner_edited
from .verdict import printable

MAX_FILE_MB, MAX_FILES = 16, 200  # what a submission may bring
STRAY = ("not a submission: expected a notebook (.ipynb), a folder holding the puzzle files (or a repository "
         "with puzzles/), or an LMS export's files named NAME_ID_pN_*.py")


class Broken(Exception):
    """The submission cannot be read (a malformed notebook, too many or too large files): one line for its row."""


@dataclass
class Submission:
    """One learner's work. Exactly one of `files` (the .py files to grade, by their name in the copy) and
    `notebook` is set, unless `error` says why there is nothing to grade."""

    name: str  # its row's name
    kind: str  # "folder", "files" (an LMS export's), "notebook", "stray"
    items: list[str]  # the entries of SUBMISSIONS it is made of
    files: dict[str, Path] | None = None
    notebook: Path | None = None
    graded: str = ""  # what of it was graded: "puzzles/", "puzzles.ipynb", "its top (3 puzzle files)", "4 files"
    note: str = ""
    flags: list[str] = field(default_factory=list)
    error: str = ""


def submissions_in(folder: Path) -> list[Submission]:
    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder: {folder}")
    items = sorted(folder.iterdir())
    if not items:
        raise FileNotFoundError(f"no submissions in {folder} (expected notebooks, folders, or an LMS export)")
    visible = [i for i in items if not i.name.startswith(".") and i.is_file() and not i.is_symlink()]
    groups, _ = lms_groups(visible)
    first_of = {min(g.files.values(), key=lambda p: p.name).name: g for g in groups}
    grouped = {p.name for g in groups for p in [*g.files.values(), *g.notebooks]}
    loose = [i for i in visible if i.name in PUZZLE_FILES]  # puzzle files with no learner's name: one learner's
    out = []
    for item in items:
        if item.name in first_of:
            out.append(from_lms(first_of[item.name]))
        elif item.name in grouped:
            continue
        elif loose and item == loose[0]:
            out.append(Submission(folder.name, "folder", [p.name for p in loose], files={p.name: p for p in loose},
                                  graded=at_the_top(len(loose)),
                                  flags=[f"puzzle files at the top of {folder.name}/, with no learner's name: graded "
                                         f"as one submission (a class is a folder or a notebook per learner)"]))
        elif item in loose:
            continue
        elif item.name.startswith("."):
            out.append(Submission(item.name, "stray", [item.name], error=STRAY))
        elif item.suffix == ".ipynb" and item.is_file():
            out.append(Submission(item.name, "notebook", [item.name], notebook=item, graded=item.name))
        elif item.is_dir():
            out.append(from_folder(item))
        else:
            out.append(Submission(item.name, "stray", [item.name], error=STRAY))
    return out


def from_folder(item: Path) -> Submission:
    work = find_work(item)
    sub = Submission(item.name, "folder", [item.name], note=work.note, flags=list(work.flags))
    if work.path is None:
        sub.error = f"nothing to grade: {work.note}"
    elif work.path.suffix == ".ipynb":
        sub.kind, sub.notebook, sub.graded = "notebook", work.path, shown(work.path, item)
    else:
        sub.graded = at_the_top(count_puzzle_files(item)) if work.path == item else shown(work.path, item)
        try:
            sub.files = top_files(work.path)
        except Broken as exc:
            sub.kind, sub.error = "broken", str(exc)
    return sub


def at_the_top(n: int) -> str:
    """The `graded` column of a submission whose puzzle files lie at its top (no deeper folder, no notebook)."""
    return f"its top ({n} puzzle file{'s' if n != 1 else ''})"


def count_puzzle_files(folder: Path) -> int:
    return sum(1 for name in PUZZLE_FILES if (folder / name).is_file())


def from_lms(group) -> Submission:
    items = sorted(p.name for p in [*group.files.values(), *group.notebooks])
    sub = Submission(group.name, "files", items, flags=list(group.flags), graded=f"{len(items)} file{'s' if len(items) != 1 else ''}")
    edited = any(learner_edited(p.read_text(errors="replace")) for name, p in group.files.items()
                 if name in PUZZLE_FILES)
    notebooks = [n for n in group.notebooks if notebook_has_work(n)]
    if group.notebooks and not edited:
        sub.kind, sub.notebook = "notebook", (notebooks or group.notebooks)[0]
        sub.graded = sub.notebook.name
        sub.note = f"Graded {sub.notebook.name}; the puzzle files were as generated."
    else:
        sub.files = dict(group.files)
        if notebooks:
            sub.flags.append(f"both puzzle files and {', '.join(n.name for n in notebooks)} hold work: graded the "
                             f"files")
    return sub


def top_files(folder: Path) -> dict[str, Path]:
    """The entries at the top of `folder` that a copy may take (the .py files, and the links it will name)."""
    entries = sorted(folder.iterdir())
    if len(entries) > MAX_FILES:
        raise Broken(f"{'the folder' if not folder.name else folder.name + '/'} holds {len(entries)} entries (at "
                     f"most {MAX_FILES})")
    return {e.name: e for e in entries if e.suffix == ".py" or e.is_symlink()}


def private_copy(sub: Submission | Path, kind: str | None = None, into: Path | None = None, worker=None) -> list[str]:
    """Copy what will be graded into `into` (the parent's own folder, which no jail can see); return the flags.
    Only regular files are copied: a symbolic link (to another student's folder, to solutions/) is not followed.
    A notebook is read by `worker` (parent.Worker: a process of its own, with a time and a memory limit, since a
    notebook is the learner's data and the parent must never wait on it), or here when there is none.
    `private_copy(folder_or_notebook, kind, into)` copies one item as it is."""
    if isinstance(sub, Path):
        item = sub
        sub = Submission(item.name, kind, [item.name], notebook=item if kind == "notebook" else None,
                         files=None if kind == "notebook" else top_files(item))
    into.mkdir(mode=0o700)
    if sub.notebook is not None:
        if sub.notebook.stat().st_size > MAX_FILE_MB << 20:
            raise Broken(f"the notebook is larger than {MAX_FILE_MB} MiB")
        problem = worker.read_notebook(sub.notebook, into) if worker is not None else copy_notebook(sub.notebook, into)
        if problem:
            raise Broken(problem)
        return []
    flags, total = [], 0
    for name, entry in sorted(sub.files.items()):
        if entry.is_symlink():
            flags.append(f"ignored the symbolic link {printable(entry.name)}")
        elif entry.is_file():
            total += entry.stat().st_size
            if total > MAX_FILE_MB << 20:
                raise Broken(f"the .py files are larger than {MAX_FILE_MB} MiB together")
            fd = os.open(entry, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as src:
                (into / name).write_bytes(src.read())
    return flags


def copy_notebook(item: Path, into: Path) -> str:
    """Write the notebook's puzzles into `into` as files; '' or why it could not be read (one line)."""
    from ..notebooks.file import notebook_target

    try:
        with notebook_target(item) as folder:
            for f in folder.glob("*.py"):
                shutil.copyfile(f, into / f.name)
    except Exception as exc:  # not JSON, not a notebook, a cell that is not text, too much code, ...
        # its name, never the path it has on the grading machine (which the learner reads in the feedback)
        first = (str(exc).replace(str(item), item.name).strip().splitlines() or [""])[0][:200]
        return f"could not read the notebook: {type(exc).__name__}: {printable(first)}"
    return ""
