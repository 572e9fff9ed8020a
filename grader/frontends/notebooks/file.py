"""The notebooks as files, generated from solutions/ by `python -m grader build`:

    puzzles.ipynb             the published notebook: its install cell takes the package from REPO_URL (in Colab
                              only; elsewhere the package is already installed)
    puzzles-standalone.ipynb  the same notebook carrying the package itself (standalone.py): one file that runs
                              in Colab or any Jupyter with torch, numpy and matplotlib, no repository, no network

Each is: an introduction, the install (or setup) cell, a short tour of the simulator, then the puzzles in
parts (PARTS: Part I, puzzles 1-8, Part II, puzzles 9-12, Part III, puzzles 13 on, each opened by a heading cell
with a short introduction), each puzzle with its story (the puzzle file's docstring, as markdown, ending with
where to write), the stub in a code cell tagged with the puzzle id, and a check cell that grades the functions
that cell defined and shows the result. Every cell has a stable id naming its role ("p3-story", "p3", "p3-check",
"part-2"), which is how `build` finds the cells a learner edited (build.py) and how grading finds the answers
when tags are lost (cells.py, which reads a notebook back).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ...specs import SPECS
from .cells import (AT_SCALE_MARK, CHECK_MARK, INSTALL_MARK, TOUR_MARK, extract_to_folder, notebook_target,
                    tagged_sources)
from .story import story_markdown
from ..stubs import stub_body

# Reading a notebook back is cells.py's; batch and the tests take these names from here.
__all__ = [
    "NOTEBOOK",
    "REPO_URL",
    "STANDALONE_NOTEBOOK",
    "build_notebook",
    "colab_url",
    "extract_to_folder",
    "notebook_target",
    "tagged_sources",
]

NOTEBOOK, STANDALONE_NOTEBOOK = "puzzles.ipynb", "puzzles-standalone.ipynb"

# The repository a Colab session installs the package from, and the README's "Open in Colab" badge. Instructors
# who fork: change this one line, then run `python -m grader build` (docs/instructors.md, "Forking").
REPO_URL = "https://github.com/training-puzzles/training-puzzles"


def colab_url(notebook: str = NOTEBOOK) -> str:
    """Where Colab opens `notebook` of the repository at REPO_URL (its main branch)."""
    return REPO_URL.replace("https://github.com/", "https://colab.research.google.com/github/") + \
        f"/blob/main/{notebook}"


INTRO = """# Training Puzzles

Puzzles about how large models are trained on many GPUs, in three parts. Part I (puzzles 1 to 8): activation
checkpointing, activation sharding, data parallel, tensor parallel, pipeline parallel (GPipe and 1F1B),
overlapping communication with compute, and ZeRO. Part II (puzzles 9 to 12): mixed precision with loss scaling,
ZeRO-3 / FSDP with prefetch, 3-D parallelism, and expert parallelism. Part III (puzzles 13 to 19), on the
transformer block: collectives from send and recv, sequence and context parallelism, interleaved and zero-bubble
pipelines, recovery from a failure, and gradient clipping under sharding. The "GPUs" are simulated ranks in this
one process, but the tensors are real: every answer is checked for its values, its gradients, its memory and,
where the puzzle is about time, its schedule.

How to play: run the next code cell first. Then, for each puzzle, read its story, write your answer in the code
cell under it (replace each `raise NotImplementedError`), run that cell, then run the check cell below it. Each
check prints PASS or FAIL per check, with what is wrong and where, and draws the memory timeline and the
schedule. Run the whole notebook untouched and every puzzle says "not attempted". Helper functions of your own
may go in any cell: grading sees every code cell you wrote.

The `dist` your functions receive mirrors `torch.distributed` (same names, arguments and in-place semantics), so
the same function runs on real processes too."""

STANDALONE_NOTE = """

This is the **standalone** notebook: it carries its own copy of the puzzles' package, which its first code cell
unpacks, so that this one file runs in Colab or in any Jupyter with torch, numpy and matplotlib, with no
repository and no network."""

INSTALL = f"""# Installs the puzzles' package when this notebook runs in Colab; does nothing elsewhere.
{INSTALL_MARK}"{REPO_URL}"
import subprocess, sys
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{{REPO_URL}}"], check=True)"""

TOUR_TEXT = """## A tour of the simulator

`sim.run(fn, world_size)` runs `fn(dist)` once per rank. Ranks take turns (the baton passes only when a rank
communicates or returns), so every run is the same. Each rank has a **memory ledger** (bytes alive over simulated
time, the peak, and what was alive at the peak, by the line of code that allocated it) and a **clock** (a compute
stream and a communication stream, in integer ticks)."""

TOUR_CODE = TOUR_MARK + """ (run it: it changes nothing you will write)
import torch
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


@dataclass(frozen=True)
class Part:
    """A part of the notebook: its heading cell comes right before the story of its first puzzle present."""

    cell_id: str
    first: int  # puzzle numbers, inclusive
    last: int
    text: str


PARTS = (
    Part("part-1", 1, 8, """# Part I: the classics (puzzles 1 to 8)

What every course on training at scale covers, each graded for real here: trading compute for memory
(activation checkpointing, activation sharding), the three ways to split the work (data, tensor and pipeline
parallel, with GPipe's and 1F1B's schedules), hiding communication behind compute, and sharding the optimizer
state (ZeRO). Each puzzle states its budgets (memory, FLOPs, bytes sent, time) as formulas with their numbers."""),
    Part("part-2", 9, 12, """# Part II: what large training runs combine (puzzles 9 to 12)

The next layer, which people who train large models put together and which no other puzzle set grades: mixed
precision and its 16 bytes per parameter (puzzle 9, after ZeRO's accounting in puzzle 8), fully sharded data
parallel with prefetching (puzzle 10: ZeRO and overlap, puzzles 7 and 8, at once), data x pipeline x tensor
parallelism on sub-groups of ranks (puzzle 11: puzzles 3, 4 and 6 at once), and mixture-of-experts with
all-to-all (puzzle 12). Same rules as Part I: real tensors, a memory ledger and a clock."""),
    Part("part-3", 13, 19, """# Part III: at scale, and when things go wrong (puzzles 13 to 19)

What the largest runs add: collectives written from sends and receives, sequence and context parallelism, pipeline
schedules that shrink the bubble, recovery from a failure, and numerics under sharding. Same rules: real tensors,
a memory ledger and a clock."""),
)


AT_SCALE_TEXT = """## At scale: your answers inside GPT-3 175B's training step

The same code, on tensors of torch's `meta` device (shapes, no values), at the size of GPT-3 175B (96 layers,
hidden size 12,288) on DGX A100s: the memory ledger, the FLOPs and the bytes are the ones a real run would have,
and the clock charges each kernel its arithmetic time plus its memory time at the share of an A100's peak rates
a kernel of that size reaches (Calculon's curves), with NVLink inside a node and InfiniBand between nodes. Your puzzle 11's `CopyToTPGroup` and `ReduceFromTPGroup` wrap every
product of a 3-D run (8-way tensor x 8 pipeline stages, 8 microbatches, no recomputation: see the first stage's
memory against the GPU's 80 GB); your puzzle 14's operators run the sequence-parallel layers of one pipeline
stage (12 layers) on all 8 of its GPUs, because they work on the default group. The model, the schedule and the
optimizer around them are the reference's (grader/predictor/); an operator that is not written, or that gets
two ranks wrong, is replaced by the reference's and the report says so. `python -m grader predict` runs any
configuration from a terminal, and bench/SCALE.md holds the predictions against the published step times.

What the prediction leaves out: kernels are charged by size, not by their real shapes, fusions and clocks; the
network has no contention and no NCCL protocol choices; the host (Python, launches, data loading), the
allocator's fragmentation and stragglers cost nothing. The cell takes about 20 seconds (17 s of one CPU core
here; longer on a slower or busier machine), and says so when it starts."""

AT_SCALE_CODE = AT_SCALE_MARK + """ (the cells above) in GPT-3 175B's step, on meta tensors.
from grader.frontends.at_scale import at_scale
at_scale(globals())"""


def part_of(spec) -> Part | None:
    number = int(spec.id[1:])
    return next((p for p in PARTS if p.first <= number <= p.last), None)


def code_without_docstring(source: str) -> str:
    """A stub's code for its notebook cell: the module docstring is the markdown above it."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(getattr(tree.body[0], "value", None), ast.Constant):
        lines = lines[tree.body[0].end_lineno:]
    return "".join(lines).strip() + "\n"


def where_to_write(spec) -> str:
    """The line under a story that says which cell holds the answer."""
    names = ", ".join(f"`{e}`" for e in spec.entries)
    return (f"**Your answer goes in the code cell below** ({names}): replace each `raise NotImplementedError`, "
            f"run the cell, then run the check cell under it.")


def check_code(puzzle_id: str) -> str:
    return (f"# Grades your {puzzle_id} cell above: run that cell first, then this one.\n"
            f'{CHECK_MARK}\ncheck("{puzzle_id}", globals())')


def new_cell(kind: str, role: str, source: str, **metadata):
    cell = (nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell)(source)
    cell["id"] = role  # stable, so that building twice writes the same file and build can match cells
    cell.metadata.update(metadata)
    return cell


def build_notebook(root: Path, solved: bool = False, standalone: bool = False) -> nbformat.NotebookNode:
    """The notebook, from solutions/ (with the solutions left in when `solved`, for testing); `standalone`: the
    variant that carries the package instead of installing it."""
    if standalone:
        from .standalone import setup_cell

        cells = [new_cell("markdown", "intro", INTRO + STANDALONE_NOTE), setup_cell()]
    else:
        cells = [new_cell("markdown", "intro", INTRO), new_cell("code", "install", INSTALL)]
    cells += [new_cell("markdown", "tour-text", TOUR_TEXT), new_cell("code", "tour-code", TOUR_CODE)]
    parts_begun = set()
    for spec in SPECS.values():
        path = root / "solutions" / spec.filename
        if not path.exists():
            continue
        part = part_of(spec)
        if part is not None and part.cell_id not in parts_begun:
            parts_begun.add(part.cell_id)
            cells.append(new_cell("markdown", part.cell_id, part.text))
        source = path.read_text()
        code = source if solved else stub_body(source, spec.filename)
        cells.append(new_cell("markdown", f"{spec.id}-story", story_markdown(source) + "\n\n" + where_to_write(spec)))
        cells.append(new_cell("code", spec.id, code_without_docstring(code), tags=[spec.id]))
        cells.append(new_cell("code", f"{spec.id}-check", check_code(spec.id), tags=[f"{spec.id}-check"]))
    if any(c.get("id") == "part-3" for c in cells):  # after Part III, where its answers are
        cells += [new_cell("markdown", "at-scale-text", AT_SCALE_TEXT), new_cell("code", "at-scale", AT_SCALE_CODE)]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb
