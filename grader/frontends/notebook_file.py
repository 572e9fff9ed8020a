"""`puzzles.ipynb` as a file: generated from solutions/ by `python -m grader build`, and read back for grading.

The notebook is: an install cell (only does something in Colab), a short tour of the simulator, then for each
puzzle its story (the puzzle file's docstring), the stub in a code cell tagged with the puzzle id, and a check
cell that grades the functions that cell defined and shows the result.
"""

from __future__ import annotations

import ast
import tempfile
from pathlib import Path

import nbformat

from ..specs import SPECS
from .stubs import stub_body

# The repository a Colab session installs the package from. Instructors who fork: change this one line
# (README, "For instructors").
REPO_URL = "https://github.com/training-puzzles/training-puzzles"

INTRO = """# Training Puzzles

Eight puzzles about how large models are trained on many GPUs: activation checkpointing, activation sharding,
data parallel, tensor parallel, pipeline parallel (GPipe and 1F1B), overlapping communication with compute, and
ZeRO. The "GPUs" are simulated ranks in this one process, but the tensors are real: every answer is checked for
its values, its gradients, its peak memory and, where the puzzle is about time, its schedule.

How to play: read a puzzle's story, fill in the code cell under it (replace the `raise NotImplementedError`), run
the check cell. Each check prints PASS or FAIL per check, with what is wrong and where, and draws the memory
timeline and the schedule. Run the whole notebook untouched and every puzzle says "not attempted".

The `dist` your functions receive mirrors `torch.distributed` (same names, arguments and in-place semantics), so
the same function runs on real processes too."""

INSTALL = f"""# Installs the puzzles' package when this notebook runs in Colab; does nothing elsewhere.
REPO_URL = "{REPO_URL}"
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{{REPO_URL}}"], check=True)"""

TOUR_TEXT = """## A tour of the simulator

`sim.run(fn, world_size)` runs `fn(dist)` once per rank. Ranks take turns (the baton passes only when a rank
communicates or returns), so every run is the same. Each rank has a **memory ledger** (bytes alive over simulated
time, the peak, and what was alive at the peak, by the line of code that allocated it) and a **clock** (a compute
stream and a communication stream, in integer ticks)."""

TOUR_CODE = """import torch
from puzzles import sim


def hello(dist):
    rank = dist.get_rank()
    t = torch.full((4,), 10.0 * (rank + 1), dtype=torch.float64)
    if rank == 0:
        dist.send(t, dst=1)          # blocks until rank 1 posts the matching recv
    else:
        dist.recv(t, src=0)          # t now holds rank 0's values: 10s, not 20s
    total = torch.tensor([rank + 1.0], dtype=torch.float64)
    dist.all_reduce(total)           # in place: every rank ends with 1 + 2 = 3
    x = torch.randn(32, 64, dtype=torch.float64)
    y = x @ torch.randn(64, 64, dtype=torch.float64)   # a matmul: costs FLOPs on the compute stream
    return t, total


result = sim.run(hello, world_size=2)
print("rank 1 received", result.results[1][0].tolist(), "and all-reduced", result.results[1][1].item())
print(result.summary())
print("rank 1's ledger (tick, bytes):", result.ledgers[1].timeline[:6], "...")
print("alive at rank 1's peak:", result.ledgers[1].peak_by_line()[:3])
for e in result.events:
    print(f"rank {e.rank} {e.stream:>7} {e.kind:<10} ticks {e.start:>6}..{e.end:<6}")"""


def story_markdown(source: str) -> str:
    """The puzzle file's docstring as markdown: its first line a heading, the rest verbatim (ASCII pictures)."""
    doc = ast.get_docstring(ast.parse(source), clean=True) or ""
    title, _, body = doc.partition("\n")
    return f"## {title.strip().rstrip('.')}\n\n```text\n{body.strip()}\n```"


def code_without_docstring(source: str) -> str:
    """A stub's code for its notebook cell: the module docstring is the markdown above it."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(getattr(tree.body[0], "value", None), ast.Constant):
        lines = lines[tree.body[0].end_lineno:]
    return "".join(lines).strip() + "\n"


def check_code(puzzle_id: str) -> str:
    return f'from grader.notebook import check\ncheck("{puzzle_id}", globals())'


def build_notebook(root: Path, solved: bool = False) -> nbformat.NotebookNode:
    """The notebook, from solutions/ (with the solutions left in when `solved`, for testing)."""
    cells = [nbformat.v4.new_markdown_cell(INTRO), nbformat.v4.new_code_cell(INSTALL),
             nbformat.v4.new_markdown_cell(TOUR_TEXT), nbformat.v4.new_code_cell(TOUR_CODE)]
    for spec in SPECS.values():
        path = root / "solutions" / spec.filename
        if not path.exists():
            continue
        source = path.read_text()
        code = source if solved else stub_body(source, spec.filename)
        cells.append(nbformat.v4.new_markdown_cell(story_markdown(source)))
        cells.append(nbformat.v4.new_code_cell(code_without_docstring(code), metadata={"tags": [spec.id]}))
        cells.append(nbformat.v4.new_code_cell(check_code(spec.id), metadata={"tags": [f"{spec.id}-check"]}))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    # Stable ids, so that building twice writes the same file.
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    return nb


def tagged_sources(path: Path) -> dict[str, str]:
    """{puzzle id: the source of the code cell(s) tagged with it} from a notebook file."""
    nb = nbformat.read(str(path), as_version=4)
    sources: dict[str, list[str]] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for tag in cell.get("metadata", {}).get("tags", []):
            sources.setdefault(tag, []).append(cell.source)
    return {tag: "\n\n".join(parts) + "\n" for tag, parts in sources.items()}


def extract_to_folder(path: Path, folder: Path) -> Path:
    """Write each puzzle's tagged cells of a notebook as pN_name.py files in `folder` (a folder laid out like
    puzzles/), so that a notebook is graded exactly like a folder."""
    sources = tagged_sources(path)
    for spec in SPECS.values():
        if spec.id in sources:
            (folder / spec.filename).write_text(f'"""{spec.id}, from {path.name}."""\n\n' + sources[spec.id])
    return folder


class notebook_target:
    """`with notebook_target(path) as folder:` a temporary folder holding the notebook's puzzle cells as files."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> Path:
        self.tmp = tempfile.TemporaryDirectory(prefix="puzzles-nb-")
        return extract_to_folder(self.path, Path(self.tmp.name))

    def __exit__(self, *exc):
        self.tmp.cleanup()
