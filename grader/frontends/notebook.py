"""The notebook's check cell: `from grader.notebook import check; check("p3", globals())` grades the functions
the puzzle's cell defined, on the simulator, and shows the result with its plots. (grader/notebook.py is the
public name; the notebook file itself is made in notebooks/file.py and read back in notebooks/cells.py.)

The cell shows the result and returns nothing, so that no `Out[N]: PuzzleResult(...)` follows it. Locations in
the messages name the notebook's cells ("your p3 cell, line 5"), not the files the kernel compiled them into.
"""

from __future__ import annotations

import io
import os
import re
import types

from ..backends import simulator
from ..core import report
from ..core.grading import fresh_seed
from ..core.result import NOT_ATTEMPTED, PuzzleResult
from ..specs import SPECS
from . import guards
from .notebooks.cells import rewrite_result


def check(puzzle_id: str, namespace: dict, seed: int | None = None, plots: bool = True, trace: str | None = None,
          schedule: bool = False) -> None:
    """The notebook's check cell: grade the functions the puzzle's cell defined, and show the result. Each
    simulated rank gets its own copy of the notebook's globals, the closest a notebook comes to each real process
    importing its own module (learner_code.namespace_copy_for_rank says what is copied). `trace="p3.json"` also
    writes the run as Chrome trace-event JSON (open it in Perfetto); `schedule=True` prints it as a text grid."""
    spec = SPECS[puzzle_id]
    seed = fresh_seed() if seed is None else seed
    missing = [e for e in spec.entries if e not in namespace]
    if missing:
        result = PuzzleResult(spec.id, spec.name, spec.title, NOT_ATTEMPTED, error=(
            f"run the {spec.id} cell first (the code cell under the story of Puzzle {spec.id[1:]}, which defines "
            f"{', '.join(spec.entries)}): "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not defined yet"))
        _display(result, seed, plots=False)
        return
    module = types.ModuleType(f"notebook_{puzzle_id}")
    module.__dict__.update({k: v for k, v in namespace.items() if not k.startswith("__")})
    try:
        with spec.run_context(), guards.no_exit():
            result = simulator.grade_module(spec, module, seed)
    except SystemExit as exc:
        result = guards.exit_result(spec, exc)
    cells = cell_names(namespace)
    result = guards.advise(rewrite_result(result, lambda text: _rename(text, cells)))
    _display(result, seed, plots)
    if (trace or schedule) and result.figures:
        from . import timeline

        if schedule:
            print(timeline.schedule_text(result))
        if trace:
            for path in timeline.write_traces([result], trace):
                print(f"wrote {path}: open it at https://ui.perfetto.dev (or chrome://tracing)")


def cell_names(namespace: dict) -> dict[str, str]:
    """{the file name the kernel compiled a cell into: 'your p3 cell' or 'your cell that defines helper'}, for
    the cells that defined the functions and classes of `namespace` (those of the notebook, module __main__)."""
    owner = {entry: spec.id for spec in SPECS.values() for entry in spec.entries}
    names: dict[str, str] = {}
    for name, value in namespace.items():
        if name.startswith("_") or getattr(value, "__module__", None) != "__main__":
            continue
        members = vars(value).values() if isinstance(value, type) else [value]
        codes = [f.__code__ for f in (getattr(m, "__func__", m) for m in members) if hasattr(f, "__code__")]
        label = f"your {owner[name]} cell" if name in owner else f"your cell that defines {name}"
        for code in codes:
            file = os.path.basename(code.co_filename)
            if name in owner or file not in names:  # a puzzle's name says more than a helper's
                names[file] = label
    return names


def _rename(text: str, cells: dict[str, str]) -> str:
    for file, label in cells.items():
        text = re.sub(rf"{re.escape(file)}:(\d+)", rf"{label}, line \1", text)
    return text


def _display(result, seed: int, plots: bool) -> None:
    try:
        from IPython.display import HTML, Image, display
    except ImportError:  # not in a notebook: print instead
        print(report.pytest_message(result, seed))
        return
    display(HTML(report.to_html(result, seed)))
    if plots and result.figures and result.status in ("pass", "fail"):
        from . import plots as plots_mod

        for fig in (plots_mod.memory_figure(result), plots_mod.schedule_figure(result)):
            display(Image(data=compact_png(fig), format="png"))
            fig.clear()


def compact_png(fig) -> bytes:
    """The figure as a PNG of at most 256 colours: the plots are flat colours, so it looks the same and is about
    a quarter of the size (measured: 146 KB -> 40 KB for p6's memory plot), which keeps a saved notebook small."""
    from .plots.canvas import png_bytes

    raw = png_bytes(fig)
    try:
        from PIL import Image as PILImage

        image = PILImage.open(io.BytesIO(raw)).convert("RGB").quantize(256, method=PILImage.Quantize.FASTOCTREE)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", optimize=True)
        return buffer.getvalue() if buffer.tell() < len(raw) else raw
    except (ImportError, AttributeError, OSError, ValueError):  # no Pillow, or an older one: the plain PNG
        return raw
