"""Pictures of what an answer did: memory over simulated time, and the schedule of the compute and comm streams.

Everything here draws from `PuzzleResult.figures` (built by core/grading.py's figures_of), so a result read back
from JSON plots the same way as a fresh one:

    memory_figure(result)            one panel per rank (ranks with identical timelines share a panel): bytes
                                     alive over simulated time, the budget line, the peak marked, and beside each
                                     panel what was alive at the peak, grouped by the learner's line
    schedule_figure(result)          a Gantt chart: per rank a compute lane (forward, backward, recompute, idle)
                                     and a comm lane beneath it, so overlap shows as bars above one another
    comparison_figure(a, b, titles)  two schedules (or memory timelines, what="memory") on one time axis
    write_plots(result, directory)   p3_memory.png and p3_schedule.png
    peak_table(result)               the peak's contents as text, for the console

The files: canvas.py (colours, figure, margins, units), memory.py (memory panels, peak_table), schedule.py
(the Gantt chart, comparisons).

Figures are plain `matplotlib.figure.Figure`s drawn with the Agg renderer; pyplot is never imported, so nothing
is registered globally, nothing is shown, and a figure is freed when it goes out of scope (`save` clears the
ones it writes). In a notebook, a returned figure displays inline (it has a `_repr_png_`).

`memory_budget` in the figures is one number for every rank or a list with one entry per rank (None: no
budget on that rank). Events labelled with torch.profiler.record_function names print the name inside their bar
when it fits ("F3", "B3"); a label containing "recompute" colours the block as recomputation.
"""

from __future__ import annotations

from pathlib import Path

from .canvas import byte_unit, field, figures_of, human_bytes, save
from .memory import budgets_per_rank, memory_figure, peak_table
from .schedule import category, comparison_figure, idle_gaps, schedule_figure

__all__ = ["memory_figure", "schedule_figure", "comparison_figure", "write_plots", "peak_table", "save",
           "byte_unit", "human_bytes", "idle_gaps", "category", "budgets_per_rank"]


def write_plots(result, directory, prefix: str | None = None) -> list[Path]:
    """Write `{id}_memory.png` and `{id}_schedule.png` for one graded result into `directory`; returns the paths
    (none for a result that did not run: an error or a puzzle not attempted)."""
    figs = figures_of(result)
    if not figs:
        return []
    prefix = prefix if prefix is not None else (field(result, "id") or "result")
    directory = Path(directory)
    return [save(memory_figure(result), directory / f"{prefix}_memory.png"),
            save(schedule_figure(result), directory / f"{prefix}_schedule.png")]
