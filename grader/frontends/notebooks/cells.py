"""A notebook read back for grading (`check` on a notebook, `batch`): which code cells are the learner's, and each
puzzle as a file made of them, so that a notebook is graded exactly like a folder laid out like puzzles/.

What runs is what Run All runs, less what is not the learner's: every code cell in the notebook's order, except
the install or setup cell, the tour and the check cells (known by their cell ids, and by their text when ids are
lost); IPython magics and shell escapes are dropped. Every puzzle's file holds all of those cells, so a helper
defined in any cell, earlier or later, is seen, as it is in the notebook. A cell that does not parse is left out
of the other puzzles' files (with a note), so a half-written p5 costs only p5.

Which cell is a puzzle's answer: the cell tagged with the puzzle's id; where tags were lost (Colab, some editors),
the cell whose id is the puzzle's id; failing that, the cell that defines the puzzle's functions. A puzzle with no
cell at all is named in a note, never graded silently as zero.

Locations in the grader's messages name cells ("your p3 cell, line 5", "your cell 14, line 2"), not the files
written here.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ...backends.learner_code import NOTEBOOK_MARK
from ...specs import SPECS

# How the generated cells that are not the learner's are known: by id, or by text when the ids are gone.
NOT_LEARNER_IDS = ("install", "setup", "tour-code", "at-scale")
INSTALL_MARK = "REPO_URL = "  # the published notebook's install cell
SETUP_MARK = "#@title Setup"  # the standalone notebook's first code cell (it carries the package)
TOUR_MARK = "# A tour of the simulator"  # the first line of the tour's code cell
AT_SCALE_MARK = "# Your puzzle 11 and 14 answers"  # the at-scale section's code cell (it runs them, it is not one)
CHECK_MARK = "from grader.notebook import check"  # every check cell
PREAMBLE = "import torch\nfrom puzzles import sim\n"  # what the tour cell imports, which later cells may rely on

# `%time x`, `!pip ...`, `files = !ls`: what stands before the `=` of an assignment from a magic. Everything here runs
# in linear time on any line: a notebook is a learner's data, read by the batch's own process (a pattern with two
# ways to match a run of spaces took 4 s on a line of 16,000 spaces, hours on a megabyte).
_TARGETS = re.compile(r"[\w.,\s\[\]]+")
_CELL_MAGICS_THAT_RUN_THE_CELL = ("%%time", "%%capture")
MAX_CODE_MB = 4  # the learner's code cells of one notebook, together (a class's answers are tens of kilobytes)


class NotebookError(ValueError):
    """The file is not a notebook that can be read."""


@dataclass
class LearnerCell:
    number: int  # the cell's position in the notebook, from 1
    source: str  # its Python, magics and shell escapes dropped (same line numbers as the cell)
    puzzle: str | None = None  # the puzzle whose answer this cell is
    error: str = ""  # why it does not parse

    @property
    def label(self) -> str:
        return f"your {self.puzzle} cell" if self.puzzle else f"your cell {self.number}"


@dataclass
class PuzzleFile:
    text: str
    spans: list[tuple[int, int, str]]  # (first line, last line, label) of each cell in `text`

    def locate(self, line: int) -> tuple[str, int] | None:
        for first, last, label in self.spans:
            if first <= line <= last:
                return label, line - first + 1
        return None


@dataclass
class Extracted:
    folder: Path
    notebook: str  # its file name, for messages
    files: dict[str, PuzzleFile] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def relocate(self, result):
        """The result with every location in a generated file turned into the cell it came from."""
        return rewrite_result(result, self.rewrite)

    def rewrite(self, text: str) -> str:
        for puzzle_id, file in self.files.items():
            def cell_line(number: str | None, file=file) -> str:
                if number is None:
                    return self.notebook
                where = file.locate(int(number))
                return f"{where[0]}, line {where[1]}" if where else f"{self.notebook} (grading preamble)"

            text = _replace_paths(text, SPECS[puzzle_id].filename, cell_line)
        return text


_PATH_END = frozenset(" \t\n\r\f\v\"':")


def _replace_paths(text: str, name: str, replace) -> str:
    """Every `name` in `text`, with the folders before it (`/tmp/x/p3_data_parallel.py`) and a line number after
    it (`:42`), replaced by `replace(the line number or None)`. Linear in the text: each folder is scanned back
    once at most, never past the previous match (a regular expression that looked back for it from every position
    was quadratic on a long word)."""
    out, done = [], 0
    for m in re.finditer(re.escape(name) + r"(?::(\d{1,9}))?", text):
        start = m.start()
        if start > done and text[start - 1] == "/":
            start -= 1
            while start > done and text[start - 1] not in _PATH_END:
                start -= 1
        out += [text[done:start], replace(m.group(1))]
        done = m.end()
    return "".join(out) + text[done:]


def drop_magics(source: str) -> str | None:
    """The cell's Python with IPython magics and shell escapes turned into `pass` (line numbers kept); None for
    a cell that a cell magic hands to something else (%%bash, %%html, ...)."""
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        if lines[0].split()[0] not in _CELL_MAGICS_THAT_RUN_THE_CELL:
            return None
        lines[0] = ""
    return "\n".join(f"{line[:len(line) - len(line.lstrip())]}pass  # {line.strip()}" if _is_magic(line) else line
                     for line in lines)


def _is_magic(line: str) -> bool:
    """A line magic or shell escape (`%time x`, `!ls`), or an assignment from one (`files = !ls`)."""
    text = line.lstrip()
    if text[:1] in ("%", "!") and text:
        return True
    targets, equals, value = text.partition("=")
    return bool(equals and targets) and value.lstrip()[:1] in ("%", "!") and value.lstrip() != "" \
        and _TARGETS.fullmatch(targets) is not None


def _defined_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(re.findall(r"^(?:def|class)\s+(\w+)", source, re.MULTILINE))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _is_learners(cell) -> bool:
    source = cell.source.lstrip()
    if cell.get("id") in NOT_LEARNER_IDS or any(t.endswith("-check") for t in _tags(cell)):
        return False
    return not (source.startswith((SETUP_MARK, TOUR_MARK, AT_SCALE_MARK)) or CHECK_MARK in source
                or source.startswith("# Installs") and INSTALL_MARK in source)


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def learner_cells(nb) -> tuple[list[LearnerCell], list[str]]:
    """The learner's code cells in order, each with the puzzle it answers; and notes on what was recovered or
    left out."""
    cells, notes, size = [], [], 0
    for number, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code" or not _is_learners(cell):
            continue
        size += len(cell.source)
        if size > MAX_CODE_MB << 20:
            raise NotebookError(f"its code cells hold more than {MAX_CODE_MB} MiB of text")
        source = drop_magics(cell.source)
        if source is None or not source.strip():
            continue
        learner = LearnerCell(number, source)
        tagged = [t for t in _tags(cell) if t in SPECS] or ([cell.get("id")] if cell.get("id") in SPECS else [])
        learner.puzzle = tagged[0] if tagged else None
        try:
            ast.parse(source)
        except SyntaxError as exc:
            learner.error = f"{type(exc).__name__} at line {exc.lineno}: {exc.msg}"
        cells.append((learner, _defined_names(source)))
    claimed = {c.puzzle for c, _ in cells if c.puzzle}
    for spec in SPECS.values():
        if spec.id in claimed:
            continue
        defining = [c for c, names in cells if c.puzzle is None and names & set(spec.entries)]
        for c in defining:  # its tag is gone: recognised by the functions it defines
            c.puzzle = spec.id
        if not defining:
            notes.append(f"no code cell holds {spec.id} (none is tagged {spec.id} or defines "
                         f"{' or '.join(spec.entries)})")
    for c, _ in cells:
        if c.error:
            whose = f"{c.puzzle} is graded with it; the other puzzles without it" if c.puzzle else \
                "the puzzles are graded without it"
            notes.append(f"cell {c.number} does not parse ({c.error}): {whose}")
    return [c for c, _ in cells], notes


def puzzle_file(cells: list[LearnerCell], puzzle_id: str, notebook: str) -> PuzzleFile:
    """One puzzle's file: the learner's cells in order (those that parse, and the puzzle's own cells whatever
    they hold), after the imports the notebook's tour made."""
    header = f'"""{puzzle_id}, from {notebook}: its code cells in order, {NOTEBOOK_MARK}."""'
    lines = [header, *PREAMBLE.splitlines()]
    spans = []
    for cell in cells:
        if cell.error and cell.puzzle != puzzle_id:
            continue
        lines.append(f"# ---- {cell.label} (cell {cell.number} of {notebook}) ----")
        body = cell.source.splitlines() or [""]
        spans.append((len(lines) + 1, len(lines) + len(body), cell.label))
        lines += body + [""]
    return PuzzleFile("\n".join(lines) + "\n", spans)


def read_notebook(path: Path):
    import nbformat  # here, so that the check cell (which needs none of this) runs without it

    try:
        return nbformat.read(str(path), as_version=4)
    except Exception as exc:  # not JSON, not a notebook, a newer format
        raise NotebookError(f"{path} is not a notebook that can be read ({type(exc).__name__}: {exc})") from exc


def extract(path: Path, folder: Path) -> Extracted:
    """Write each puzzle's file (pN_name.py) into `folder`, from the notebook at `path`."""
    cells, notes = learner_cells(read_notebook(path))
    out = Extracted(Path(folder), Path(path).name, notes=notes)
    for spec in SPECS.values():
        out.files[spec.id] = puzzle_file(cells, spec.id, out.notebook)
        (out.folder / spec.filename).write_text(out.files[spec.id].text)
    return out


def extract_to_folder(path: Path, folder: Path) -> Path:
    """Write the notebook's puzzles as pN_name.py files in `folder` (a folder laid out like puzzles/)."""
    return extract(path, folder).folder


def tagged_sources(path: Path) -> dict[str, str]:
    """{puzzle id: the source of the learner's cell(s) that answer it} from a notebook file."""
    cells, _ = learner_cells(read_notebook(path))
    sources: dict[str, list[str]] = {}
    for cell in cells:
        if cell.puzzle:
            sources.setdefault(cell.puzzle, []).append(cell.source)
    return {p: "\n\n".join(parts) + "\n" for p, parts in sources.items()}


class notebook_target:
    """`with notebook_target(path) as folder:` a temporary folder holding the notebook's puzzles as files;
    `.extracted` says which cell is which (`.relocate(result)`) and what was recovered or left out (`.notes`)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self) -> Path:
        self.tmp = tempfile.TemporaryDirectory(prefix="puzzles-nb-")
        try:
            self.extracted = extract(self.path, Path(self.tmp.name))
        except BaseException:
            self.tmp.cleanup()
            raise
        return self.extracted.folder

    def __exit__(self, *exc):
        self.tmp.cleanup()


def rewrite_strings(value, rewrite):
    """`value` with `rewrite` applied to every string inside it (dicts, lists and tuples are rebuilt)."""
    if isinstance(value, str):
        return rewrite(value)
    if isinstance(value, dict):
        return {k: rewrite_strings(v, rewrite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(rewrite_strings(v, rewrite) for v in value)
    return value


def rewrite_result(result, rewrite):
    """A PuzzleResult with its messages (error, checks, the sites in its figures) passed through `rewrite`."""
    checks = [dataclasses.replace(c, message=rewrite(c.message), diagnosis=rewrite(c.diagnosis))
              for c in result.checks]
    return dataclasses.replace(result, error=rewrite(result.error), checks=checks,
                               figures=rewrite_strings(result.figures, rewrite))
