"""`python -m grader release OUT`: the copy a class receives. Everything a learner needs, no solution.

    released_files(root)   every file of the copy, by its path in it: THE list (extend it here)
    named_paths(files)     the paths a learner's texts name (the README, the stories, the notebooks'), which the
                           copy must hold
    package_files(root)    the part that `pip install` needs (also the Gradescope bundle's package)
    learner_readme(text)   the README's learner sections; instructor material left out
    solution_leaks(files)  what of solutions/ some files give away (the release refuses to write any)
    write_release(root, out)

The stubs are generated afresh from solutions/ by the build's own functions (build.planned_files,
build.notebook_text), never copied from puzzles/, where an instructor may have solved them. The copy holds no
solutions/, no tests/naive or tests/wrong, no benchmark and no project test (of bench/ only the recorded
results that the README, a story or the notebook cites, so that the citation opens): its `pytest` runs the self-grading
tests only (tests/test_puzzles.py: a stub is skipped as not attempted), and its `python -m grader` grades its
own puzzles/. The project's own suite stays the instructor's and needs solutions/ (it holds the references to
their budgets); the copy's tests never do.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from . import build
from .notebooks.standalone import embedded_files
from .shipping import shipped
from .stubs import BEGIN, END, END_HANDED_OUT, HANDED_OUT

# The README's sections by heading: the learner's are copied, the instructor's left out. A heading in neither
# list is left out too (and named by the command), so that new instructor material never ships by accident.
LEARNER_SECTIONS = ("Quickstart", "Solving the puzzles", "What to hand in", "How grading works", "The clock",
                    "The simulator", "Predicting a step at scale", "Running on real torch.distributed")
INSTRUCTOR_SECTIONS = ("For instructors",)  # its links point to docs/, which stays the instructor's

# Keeps a learner's environment and caches out of their commits (a copy is often pushed to a repository).
GITIGNORE = """.venv/
venv/
__pycache__/
*.pyc
*.egg-info/
.ipynb_checkpoints/
.pytest_cache/
"""

COPY_NOTE = ("This is your copy of the puzzles: `puzzles/` holds the files you fill in, `puzzles.ipynb` the same "
             "puzzles as a notebook, and `pytest` or `python -m grader` grades them (a puzzle you have not started "
             "is skipped as \"not attempted\").")

SELF_GRADING_TESTS = ("conftest.py", "tests/conftest.py", "tests/test_puzzles.py")  # plain `pytest` (pyproject)
_PUZZLE_FILE = re.compile(r"^p\d+_\w+\.py$")


def released_files(root: Path) -> dict[str, str | bytes]:
    """Every file of the student copy, by its path in the copy (text: generated; bytes: copied as is). To ship
    another file (the standalone notebook, a learner-only pytest setup), add it here: tests/test_release.py
    checks the whole copy for solutions and runs its own `pytest` and `python -m grader`."""
    files = package_files(root)
    files[build.NOTEBOOK] = build.notebook_text(build.fresh_notebook(root))
    files[build.STANDALONE_NOTEBOOK] = build.notebook_text(build.fresh_notebook(root, standalone=True))
    for rel in SELF_GRADING_TESTS:
        files[rel] = (root / rel).read_bytes()
    for rel in named_records(files):
        files[rel] = (root / rel).read_bytes()
    files[".gitignore"] = GITIGNORE
    return files


# A file of the copy named where a learner reads (the README, a story, the notebooks' text): bench/CORPUS.md.
NAMED_PATH = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)+[\w.-]+\.(?:md|py|ipynb|json|png|toml))\b")
RECORDS = "bench/"  # the benchmarks' recorded results: what the README and the stories cite for their figures


def learner_texts(files: dict[str, str | bytes]) -> dict[str, str]:
    """What a learner reads of the copy, by file: its README, each stub's story (the module docstring) and each
    notebook's markdown cells. A path it names (`bench/CORPUS.md`) is relative to the copy's top."""
    import ast

    texts = {"README.md": _text(files["README.md"])}
    for rel, data in files.items():
        if rel.startswith("puzzles/") and _PUZZLE_FILE.match(rel[8:]):
            texts[rel] = ast.get_docstring(ast.parse(_text(data))) or ""
        elif rel.endswith(".ipynb"):
            nb = nbformat.reads(_text(data), as_version=4)
            texts[rel] = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return texts


def named_paths(files: dict[str, str | bytes]) -> dict[str, list[str]]:
    """{a path a learner reads: the files that name it}."""
    named: dict[str, list[str]] = {}
    for rel, text in learner_texts(files).items():
        for path in NAMED_PATH.findall(text):
            named.setdefault(path, []).append(rel)
    return named


def named_records(files: dict[str, str | bytes]) -> list[str]:
    """The recorded results (bench/*.md) that the learner's texts cite: they ship, so that each citation opens."""
    return sorted(p for p in named_paths(files) if p.startswith(RECORDS) and p.endswith(".md"))


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def package_files(root: Path) -> dict[str, str | bytes]:
    """grader/ and puzzles/ (with the stubs generated from solutions/), pyproject.toml and the learner's README:
    what `pip install` of the copy needs."""
    files: dict[str, str | bytes] = {}
    for package in ("grader", "puzzles"):
        for path in sorted((root / package).rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and shipped(rel):
                files[rel.as_posix()] = path.read_bytes()
    files = {rel: data for rel, data in files.items()
             if not (rel.startswith("puzzles/") and rel.count("/") == 1 and _PUZZLE_FILE.match(rel[8:]))}
    for path, text in build.planned_files(root).items():
        files[path.relative_to(root).as_posix()] = text
    files["pyproject.toml"] = (root / "pyproject.toml").read_bytes()
    files["README.md"] = learner_readme((root / "README.md").read_text())[0]
    return files


def learner_readme(text: str) -> tuple[str, list[str]]:
    """(the README for learners, the headings left out that neither list names)."""
    parts = re.split(r"(?m)^(?=## )", text)
    preamble, sections = parts[0], parts[1:]
    kept, unknown = [preamble.rstrip() + "\n\n" + COPY_NOTE + "\n\n"], []
    for section in sections:
        heading = section.splitlines()[0][3:].strip()
        if heading in LEARNER_SECTIONS:
            kept.append(section)
        elif heading not in INSTRUCTOR_SECTIONS:
            unknown.append(heading)
    readme = "".join(kept).rstrip() + "\n"
    # The project's own development line is the instructor's: the copy has no tests/ to run.
    readme = re.sub(r"\n\n# Set up for development[^\n]*\n[^\n]*\n", "\n", readme)
    # The copy has no solutions/ to grade, nor docs/: its examples grade the learner's own files, and a link to
    # the instructor's documents becomes plain words.
    readme = re.sub(r"(check|--target) solutions\b", r"\1 puzzles", readme)
    readme = re.sub(r"\[([^\]]+)\]\(docs/[^)]*\)", r"your instructor's documents", readme)
    return readme, unknown


def _text_lines(rel: str, data: str | bytes) -> list[str]:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    if rel.endswith(".ipynb"):
        nb = nbformat.reads(text, as_version=4)
        return [line for cell in nb.cells for line in cell.source.splitlines()]
    return text.splitlines()


def solution_regions(root: Path, begin: str = BEGIN, end: str = END) -> dict[str, list[list[str]]]:
    """{solution file: its solution regions, each as its stripped lines of code (no blanks, no comments)}; with
    the handed-out markers, the programs a Part IV puzzle hands out broken, uncommented (stubs.py)."""
    regions = {}
    handed_out = begin == HANDED_OUT
    for path in sorted((root / "solutions").glob("p*_*.py")):
        found, current = [], None
        for line in path.read_text().splitlines():
            mark = line.strip()
            if mark.startswith(begin) if handed_out else mark == begin:
                current = []
            elif mark == end and current is not None:
                found.append(current)
                current = None
            elif current is not None and handed_out:
                code = mark[1:].strip()  # each line behind "# "
                if code and not code.startswith("#"):
                    current.append(code)
            elif current is not None and mark and not mark.startswith("#"):
                current.append(mark)
        regions[path.name] = found
    return regions


WINDOW = 3  # consecutive lines of a solution region that make a leak; two can be ordinary code (the spec's
#             serial reference shares `for i, (w1, w2) in enumerate(layers):` / `if i % k == 0:` with p1's)


def unpacked(files: dict[str, str | bytes]) -> dict[str, str | bytes]:
    """The files, and beside each notebook the files of the package its setup cell carries (the standalone
    notebook's), as NOTEBOOK!path: what a learner can read in the copy, not only what it shows."""
    out = dict(files)
    for rel, data in files.items():
        if rel.endswith(".ipynb"):
            text = data.decode(errors="replace") if isinstance(data, bytes) else data
            for cell in nbformat.reads(text, as_version=4).cells:
                out.update({f"{rel}!{name}": body for name, body in embedded_files(cell.source).items()})
    return out


def solution_leaks(files: dict[str, str | bytes], root: Path) -> list[str]:
    """What of solutions/ the files give away (a notebook's embedded package included): a solution file's
    content, a BEGIN/END SOLUTION marker line, or WINDOW consecutive lines of code of a solution region, whatever
    their indentation (a region shorter than that, like p4's `return grad, None`, cannot be told from ordinary
    code and is not looked for; tests/test_release.py looks for single distinctive lines too)."""
    files = unpacked(files)
    solutions = {p.read_bytes() for p in (root / "solutions").glob("*.py")}
    windows = {tuple(region[i:i + WINDOW]): name for name, found in solution_regions(root).items()
               for region in found for i in range(len(region) - WINDOW + 1)}
    for found in solution_regions(root, HANDED_OUT, END_HANDED_OUT).values():  # a broken program's lines that the
        for region in found:                                                     # fix keeps are handed out anyway
            for i in range(len(region) - WINDOW + 1):
                windows.pop(tuple(region[i:i + WINDOW]), None)
    leaks = []
    for rel, data in files.items():
        raw = data.encode() if isinstance(data, str) else data
        if raw in solutions:
            leaks.append(f"{rel} is a file of solutions/")
        lines = [line.strip() for line in _text_lines(rel, data)]
        leaks += [f"{rel} has a {mark!r} line" for mark in lines if mark in (BEGIN, END)]
        code = [line for line in lines if line and not line.startswith("#")]
        for i in range(len(code) - WINDOW + 1):
            name = windows.get(tuple(code[i:i + WINDOW]))
            if name:
                leaks.append(f"{rel} has the code of solutions/{name}: {code[i]!r} ...")
                break
    return leaks


def write_release(root: Path, out: Path) -> list[Path]:
    """Write the copy into `out` (a new or empty folder). Refuses, writing nothing, when any file would give a
    solution away."""
    out = Path(out)
    if not (root / "solutions").is_dir():
        raise FileNotFoundError(f"no solutions/ in {root}: a release is made from the instructor's repository")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty: give a new folder")
    files = released_files(root)
    leaks = solution_leaks(files, root)
    if leaks:
        raise ValueError("the release would give solutions away:\n" + "\n".join(leaks))
    written = []
    for rel, data in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        written.append(path)
    return written
