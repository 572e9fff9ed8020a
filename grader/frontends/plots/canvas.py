"""What every plot shares: colours, the figure and its margins, the title and legend, units, reading a result."""

from __future__ import annotations

import io
import re
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

# Colours (colour-blind-safe, after Okabe & Ito / Tableau): one per kind of interval.
COLOURS = {
    "forward": "#4C78A8",  # blue
    "backward": "#F58518",  # orange
    "recompute": "#B279A2",  # purple
    "collective": "#54A24B",  # green
    "send/recv": "#2CA6A4",  # teal
    "disk": "#9D755D",  # brown: a checkpoint's reads and writes (p18)
    "sync": "#E45756",  # red: the host waits for the device (.item(), .cpu(), print: p21)
    "loading": "#EECA3B",  # yellow: a batch loaded, by the host or a loader worker (p21)
    "waiting for data": "#FF9DA6",  # pink: the host waits for a worker's batch
    "idle": "#E4E4E4",  # light grey
}
LEGEND_NAMES = {
    "forward": "forward",
    "backward": "backward",
    "recompute": "recompute",
    "collective": "collective",
    "send/recv": "send / recv",
    "disk": "disk (checkpoint i/o)",
    "sync": "host waits for the device",
    "loading": "data loading",
    "waiting for data": "host waits for data",
    "idle": "idle (compute stream)",
}
# Edges: white between adjacent compute blocks; a dark edge on comm bars, so that a message of a few ticks still
# shows as a line on a chart of thousands.
EDGE = {"idle": "none", "collective": "#2E6B29", "send/recv": "#17706E"}
TEXT_ON = {"idle": "#555555", "loading": "#333333"}  # text colour inside a bar of this category (default white)
P2P = {"send", "recv", "isend", "irecv"}
MEMORY_LINE = "#1F5FA8"
BUDGET_COLOUR = "#D62728"
DPI = 100
PNG = {"compress_level": 1}  # a little larger than the default level, and much faster to write


# ---- shared helpers


def _is_result_dict(d) -> bool:
    return isinstance(d, dict) and "status" in d and "id" in d  # PuzzleResult.to_dict(), as in --json output


def field(result, key: str, default=""):
    """A field of a PuzzleResult, or of its `to_dict(figures=True)` form read back from JSON."""
    if isinstance(result, dict):
        return result.get(key, default) if _is_result_dict(result) else default
    return getattr(result, key, default)


def figures_of(result) -> dict:
    """The figures of a PuzzleResult, of its JSON form, or a figures dict itself."""
    if result is None:
        return {}
    if isinstance(result, dict):
        return (result.get("figures") or {}) if _is_result_dict(result) else result
    return result.figures or {}


def title_of(result) -> str:
    pid, title = field(result, "id"), field(result, "title")
    return f"{pid} {title}".strip() or "result"


def status_note(result) -> str:
    status = field(result, "status")
    return f" ({status})" if status else ""


def byte_unit(max_bytes: float) -> tuple[str, int]:
    """The unit that makes `max_bytes` read as a small number: ('MiB', 2**20), ('KiB', 1024) or ('bytes', 1)."""
    if max_bytes >= 1 << 20:
        return "MiB", 1 << 20
    if max_bytes >= 1 << 10:
        return "KiB", 1 << 10
    return "bytes", 1


def human_bytes(n: float) -> str:
    """'2.13 MiB', '512.0 KiB', '8 B'."""
    unit, scale = byte_unit(abs(n))
    if scale == 1:
        return f"{int(n)} B"
    return f"{n / scale:.2f} {unit}" if unit == "MiB" else f"{n / scale:.1f} {unit}"


ticks_formatter = FuncFormatter(lambda x, _pos: f"{x:,.0f}")


def rank_names(ranks: list[int]) -> str:
    """'rank 2', 'ranks 0-3', 'ranks 0, 2'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def short_site(site: str, puzzle_id: str = "", width: int = 60) -> str:
    """'p3_data_parallel.py:39: loss.backward()' -> 'line 39: loss.backward()' for the puzzle's own file."""
    site = re.sub(r"^\[harness\] \S+?:\d+:?", "grader:", site)  # the grader's code around yours
    if puzzle_id:
        site = re.sub(rf"^{re.escape(puzzle_id)}_\w+\.py:(\d+)", r"line \1", site)
    site = " ".join(site.split())
    return site if len(site) <= width else site[: width - 1] + "\u2026"


# Fixed margins, in inches (a layout engine would measure every label on every draw: too slow for a grader).
FIG_WIDTH = 13.0
LEFT_IN, RIGHT_IN = 1.15, 0.75  # rank names on the left; the idle shares on the right of a schedule
TOP_IN, BOTTOM_IN = 0.85, 0.55  # title and legend above; tick labels and the axis label below


def margins(height: float, right: float = RIGHT_IN, top: float = TOP_IN) -> dict:
    return dict(left=LEFT_IN / FIG_WIDTH, right=1 - right / FIG_WIDTH, top=1 - top / height,
                bottom=BOTTOM_IN / height)


TITLE_SIZE, TITLE_SIZE_LEAST = 11.5, 8.0


def title_and_legend(fig: Figure, height: float, title: str, handles) -> None:
    """The title on the first line, the legend on the second, both above the axes. A title too long for the
    figure's width is set smaller (down to TITLE_SIZE_LEAST points), and cut with an ellipsis beyond that."""
    text = fig.text(LEFT_IN / FIG_WIDTH, 1 - 0.12 / height, title, ha="left", va="top", fontsize=TITLE_SIZE,
                    weight="bold")
    room = (FIG_WIDTH - LEFT_IN - 0.1) * fig.dpi  # pixels from the title's start to the figure's right edge
    wide = text.get_window_extent(fig.canvas.get_renderer()).width
    if wide > room:
        size = max(TITLE_SIZE_LEAST, TITLE_SIZE * room / wide)
        text.set_fontsize(size)
        keep = int(len(title) * room / (wide * size / TITLE_SIZE))  # characters that fit at that size
        if keep < len(title):
            text.set_text(title[: max(1, keep - 1)].rstrip() + "\u2026")
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(LEFT_IN / FIG_WIDTH - 0.01, 1 - 0.4 / height),
               ncol=len(handles), fontsize=8.5, frameon=False, handlelength=1.8, columnspacing=1.6,
               borderaxespad=0)


def new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas, outside pyplot. It shows itself in a notebook (IPython calls _repr_png_)
    whether or not the inline backend is active."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    fig._repr_png_ = lambda: png_bytes(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, pil_kwargs=PNG)
    return buffer.getvalue()


def no_data_figure(result, what: str) -> Figure:
    fig = new_figure(8, 1.6)
    status = field(result, "status")
    error = (field(result, "error") or "").splitlines()
    why = f"{status}: {error[0]}" if error else (status or "no data")
    fig.text(0.5, 0.62, f"{title_of(result)}: no {what} to plot", ha="center", va="center", fontsize=12,
             weight="bold")
    fig.text(0.5, 0.32, short_site(why, width=110), ha="center", va="center", fontsize=9, color="#555555")
    return fig


def save(fig: Figure, path) -> Path:
    """Write `fig` as a PNG and release what it drew."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, pil_kwargs=PNG if path.suffix.lower() == ".png" else None)
    fig.clear()
    return path
