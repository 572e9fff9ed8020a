"""Pictures of what an answer did: memory over simulated time, and the schedule of the compute and comm streams.

Everything here draws from `PuzzleResult.figures` (built by runner.figures_of), so a result read back from JSON
plots the same way as a fresh one:

    memory_figure(result)            one panel per rank (ranks with identical timelines share a panel): bytes
                                     alive over simulated time, the budget line, the peak marked, and beside each
                                     panel what was alive at the peak, grouped by the learner's line
    schedule_figure(result)          a Gantt chart: per rank a compute lane (forward, backward, recompute, idle)
                                     and a comm lane beneath it, so overlap shows as bars above one another
    comparison_figure(a, b, titles)  two schedules (or memory timelines, what="memory") on one time axis
    write_plots(result, directory)   p3_memory.png and p3_schedule.png
    peak_table(result)               the peak's contents as text, for the console

Figures are plain `matplotlib.figure.Figure`s drawn with the Agg renderer; pyplot is never imported, so nothing
is registered globally, nothing is shown, and a figure is freed when it goes out of scope (`save` clears the
ones it writes). In a notebook, a returned figure displays inline (it has a `_repr_png_`).

`memory_budget` in the figures is one number for every rank or a list with one entry per rank (None: no
budget on that rank). Events labelled with torch.profiler.record_function names print the name inside their bar
when it fits ("F3", "B3"); a label containing "recompute" colours the block as recomputation.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from .result import fmt

# Colours (colour-blind-safe, after Okabe & Ito / Tableau): one per kind of interval.
COLOURS = {
    "forward": "#4C78A8",  # blue
    "backward": "#F58518",  # orange
    "recompute": "#B279A2",  # purple
    "collective": "#54A24B",  # green
    "send/recv": "#2CA6A4",  # teal
    "idle": "#E4E4E4",  # light grey
}
LEGEND_NAMES = {
    "forward": "forward",
    "backward": "backward",
    "recompute": "recompute",
    "collective": "collective",
    "send/recv": "send / recv",
    "idle": "idle (compute stream)",
}
# Edges: white between adjacent compute blocks; a dark edge on comm bars, so that a message of a few ticks still
# shows as a line on a chart of thousands.
_EDGE = {"idle": "none", "collective": "#2E6B29", "send/recv": "#17706E"}
_TEXT_ON = {"idle": "#555555"}  # text colour inside a bar of this category (default white)
_P2P = {"send", "recv", "isend", "irecv"}
MEMORY_LINE = "#1F5FA8"
BUDGET_COLOUR = "#D62728"
DPI = 100
_PNG = {"compress_level": 1}  # a little larger than the default level, and much faster to write


# ---- shared helpers


def _is_result_dict(d) -> bool:
    return isinstance(d, dict) and "status" in d and "id" in d  # PuzzleResult.to_dict(), as in --json output


def _get(result, key: str, default=""):
    """A field of a PuzzleResult, or of its `to_dict(figures=True)` form read back from JSON."""
    if isinstance(result, dict):
        return result.get(key, default) if _is_result_dict(result) else default
    return getattr(result, key, default)


def _figures(result) -> dict:
    """The figures of a PuzzleResult, of its JSON form, or a figures dict itself."""
    if result is None:
        return {}
    if isinstance(result, dict):
        return (result.get("figures") or {}) if _is_result_dict(result) else result
    return result.figures or {}


def _name(result) -> str:
    pid, title = _get(result, "id"), _get(result, "title")
    return f"{pid} {title}".strip() or "result"


def _status(result) -> str:
    status = _get(result, "status")
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


_ticks_formatter = FuncFormatter(lambda x, _pos: f"{x:,.0f}")


def _rank_names(ranks: list[int]) -> str:
    """'rank 2', 'ranks 0-3', 'ranks 0, 2'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _short_site(site: str, puzzle_id: str = "", width: int = 60) -> str:
    """'p3_data_parallel.py:39: loss.backward()' -> 'line 39: loss.backward()' for the puzzle's own file."""
    site = re.sub(r"^\[harness\] \S+?:\d+:?", "grader:", site)  # the grader's code around yours
    if puzzle_id:
        site = re.sub(rf"^{re.escape(puzzle_id)}_\w+\.py:(\d+)", r"line \1", site)
    site = " ".join(site.split())
    return site if len(site) <= width else site[: width - 1] + "\u2026"


# Fixed margins, in inches (a layout engine would measure every label on every draw: too slow for a grader).
FIG_WIDTH = 13.0
_LEFT_IN, _RIGHT_IN = 1.15, 0.75  # rank names on the left; the idle shares on the right of a schedule
_TOP_IN, _BOTTOM_IN = 0.85, 0.55  # title and legend above; tick labels and the axis label below


def _margins(height: float, right: float = _RIGHT_IN, top: float = _TOP_IN) -> dict:
    return dict(left=_LEFT_IN / FIG_WIDTH, right=1 - right / FIG_WIDTH, top=1 - top / height,
                bottom=_BOTTOM_IN / height)


def _head(fig: Figure, height: float, title: str, handles) -> None:
    """The title on the first line, the legend on the second, both above the axes."""
    fig.text(_LEFT_IN / FIG_WIDTH, 1 - 0.12 / height, title, ha="left", va="top", fontsize=11.5, weight="bold")
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(_LEFT_IN / FIG_WIDTH - 0.01, 1 - 0.4 / height),
               ncol=len(handles), fontsize=8.5, frameon=False, handlelength=1.8, columnspacing=1.6,
               borderaxespad=0)


def _new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas, outside pyplot. It shows itself in a notebook (IPython calls _repr_png_)
    whether or not the inline backend is active."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    fig._repr_png_ = lambda: _png_bytes(fig)
    return fig


def _png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, pil_kwargs=_PNG)
    return buffer.getvalue()


def _no_data_figure(result, what: str) -> Figure:
    fig = _new_figure(8, 1.6)
    status = _get(result, "status")
    error = (_get(result, "error") or "").splitlines()
    why = f"{status}: {error[0]}" if error else (status or "no data")
    fig.text(0.5, 0.62, f"{_name(result)}: no {what} to plot", ha="center", va="center", fontsize=12,
             weight="bold")
    fig.text(0.5, 0.32, _short_site(why, width=110), ha="center", va="center", fontsize=9, color="#555555")
    return fig


# ---- memory


def budgets_per_rank(figs: dict) -> list:
    """The memory budget of each rank in bytes (None: no budget). `memory_budget` is one number for every rank,
    or a list with one entry per rank (a budget on stage 0 only, say)."""
    ranks = [l["rank"] for l in figs.get("ledgers") or []]
    budget = figs.get("memory_budget")
    if isinstance(budget, (list, tuple)):
        return [budget[r] if r < len(budget) else None for r in ranks]
    return [budget for _ in ranks]


def _budget_summary(budgets: list) -> str:
    """'budget 1,101,824 bytes (1.05 MiB) per rank', 'budget on rank 0: ...', 'no memory budget'."""
    values = {b for b in budgets if b is not None}
    if not values:
        return "no memory budget"
    if len(values) == 1 and None not in budgets:
        return f"budget {fmt(values.pop(), 'bytes')} per rank"
    limited = [(r, b) for r, b in enumerate(budgets) if b is not None]
    return "budget " + ", ".join(f"rank {r}: {human_bytes(b)}" for r, b in limited)


def _budget_mark(peak: int, budget) -> str:
    if budget is None:
        return ""
    return f"{100 * peak / budget:.0f}% of budget {human_bytes(budget)}" + (", OVER" if peak > budget else "")


def _ledger_key(ledger: dict | None, budget=None) -> tuple:
    if ledger is None:
        return ()
    return (tuple(map(tuple, ledger["timeline"])), ledger["peak"], ledger["peak_tick"], budget,
            tuple((p["site"], p["bytes"], p["count"]) for p in ledger["peak_by_line"]))


def _rank_groups(figs: dict, merge_identical: bool) -> list[tuple[list[int], dict, int | None]]:
    """[(ranks, ledger, budget)]: ranks with identical timelines, peak contents and budgets share one panel."""
    groups: dict = {}
    for ledger, budget in zip(figs.get("ledgers") or [], budgets_per_rank(figs)):
        key = _ledger_key(ledger, budget) if merge_identical else (id(ledger),)
        groups.setdefault(key, ([], ledger, budget))[0].append(ledger["rank"])
    return list(groups.values())


def _step_xy(timeline, end: int, scale: float):
    xs = [t for t, _ in timeline]
    ys = [b / scale for _, b in timeline]
    if not xs:
        xs, ys = [0], [0.0]
    if end > xs[-1]:  # hold the last value to the end of the run
        xs.append(end)
        ys.append(ys[-1])
    return xs, ys


def _peak_lines(ledger: dict, puzzle_id: str, top: int, width: int) -> list[str]:
    """The peak's contents, largest first: '  1.01 MiB  x10  input placed on the rank by sim.run'."""
    rows = ledger.get("peak_by_line") or []
    if len(rows) == top + 1:  # a summary line would take the place of the line it summarises
        top += 1
    out = [f"{human_bytes(r['bytes']):>10}  x{r['count']:<3} {_short_site(r['site'], puzzle_id, width)}"
           for r in rows[:top]]
    if len(rows) > top:
        rest = rows[top:]
        out.append(f"{human_bytes(sum(r['bytes'] for r in rest)):>10}  x{sum(r['count'] for r in rest):<3} "
                   f"({len(rest)} more line{'s' if len(rest) > 1 else ''})")
    return out


def memory_figure(result, merge_identical: bool = True, top: int = 4) -> Figure:
    """Bytes alive on each rank over simulated time, with the budget and the peak, and the peak's contents.

    Ranks whose timelines are identical (data parallel, tensor parallel) share one panel, titled 'ranks 0-3';
    pass merge_identical=False for one panel per rank. `top` lines of the peak are listed beside each panel."""
    figs = _figures(result)
    ledgers = figs.get("ledgers") or []
    if not ledgers:
        return _no_data_figure(result, "memory timeline")
    budgets = budgets_per_rank(figs)
    makespan = int(figs.get("makespan") or 0)
    puzzle_id = _get(result, "id")
    groups = _rank_groups(figs, merge_identical)
    n = len(groups)
    end = max([makespan] + [l["timeline"][-1][0] for l in ledgers if l["timeline"]] + [1])
    top_bytes = max([l["peak"] for l in ledgers] + [b for b in budgets if b is not None] + [1])
    unit, scale = byte_unit(top_bytes)

    row_h = 1.55 if n <= 4 else 1.2
    height = _TOP_IN + _BOTTOM_IN + row_h * n
    fig = _new_figure(FIG_WIDTH, height)
    gs = fig.add_gridspec(n, 2, width_ratios=[1.6, 1], wspace=0.03, hspace=0.12, **_margins(height, right=0.1))
    axes = []
    for i, (ranks, ledger, budget) in enumerate(groups):
        ax = fig.add_subplot(gs[i, 0], sharex=axes[0] if axes else None, sharey=axes[0] if axes else None)
        axes.append(ax)
        xs, ys = _step_xy(ledger["timeline"], end, scale)
        ax.fill_between(xs, ys, step="post", color=MEMORY_LINE, alpha=0.15, linewidth=0)
        ax.step(xs, ys, where="post", color=MEMORY_LINE, linewidth=1.3, label="bytes alive", gid="memory")
        over = budget is not None and ledger["peak"] > budget
        if budget is not None:
            ax.axhline(budget / scale, color=BUDGET_COLOUR, linestyle="--", linewidth=1.2, label="budget",
                       gid="budget")
        peak_colour = BUDGET_COLOUR if over else "black"
        ax.plot([ledger["peak_tick"]], [ledger["peak"] / scale], marker="v", markersize=8, color=peak_colour,
                linestyle="none", label="peak", gid="peak")
        right = ledger["peak_tick"] > 0.6 * end
        ax.annotate(f"peak {human_bytes(ledger['peak'])}", (ledger["peak_tick"], ledger["peak"] / scale),
                    xytext=(-8 if right else 8, 4), textcoords="offset points", ha="right" if right else "left",
                    va="bottom", fontsize=8.5, color=peak_colour, weight="bold", zorder=5,
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
        ax.set_ylabel(f"{_rank_names(ranks)}\n({unit})", fontsize=9.5, rotation=0, ha="right", va="center",
                      labelpad=6)
        ax.grid(True, axis="both", color="#DDDDDD", linewidth=0.6)
        ax.tick_params(labelsize=8)
        if i < n - 1:
            ax.tick_params(labelbottom=False)

        text_ax = fig.add_subplot(gs[i, 1])
        text_ax.axis("off")
        head = f"{_rank_names(ranks)}: peak {human_bytes(ledger['peak'])} at tick {ledger['peak_tick']:,}"
        if budget:
            head += f" ({100 * ledger['peak'] / budget:.0f}% of budget)"
        lines = _peak_lines(ledger, puzzle_id, top, width=46) or ["(nothing alive)"]
        text_ax.text(0, 1, head, transform=text_ax.transAxes, va="top", ha="left", fontsize=8.5, weight="bold",
                     color=peak_colour)
        text_ax.annotate("\n".join(lines), (0, 1), xycoords="axes fraction", xytext=(0, -16),
                         textcoords="offset points", va="top", ha="left", fontsize=7.8, family="monospace",
                         linespacing=1.35, gid="peak_table")

    axes[0].set_xlim(0, end * 1.01)
    axes[0].set_ylim(0, top_bytes / scale * 1.22)
    axes[0].xaxis.set_major_formatter(_ticks_formatter)
    axes[-1].set_xlabel("simulated time (ticks)", fontsize=9.5)
    handles = [Line2D([], [], color=MEMORY_LINE, linewidth=1.5, label=f"bytes alive on the rank ({unit})")]
    values = {b for b in budgets if b is not None}
    if values:
        label = f"budget {human_bytes(values.pop())}" if len(values) == 1 else "budget"
        handles.append(Line2D([], [], color=BUDGET_COLOUR, linestyle="--", label=label))
    handles.append(Line2D([], [], marker="v", color="black", linestyle="none", label="peak (first reached)"))
    _head(fig, height, f"{_name(result)}{_status(result)}: memory per rank ({_budget_summary(budgets)})", handles)
    return fig


def peak_table(result, top: int = 6) -> str:
    """What was alive at each rank's peak, by the learner's line, as console text (identical ranks merged)."""
    figs = _figures(result)
    if not figs.get("ledgers"):
        return f"{_name(result)}: no memory data"
    puzzle_id = _get(result, "id")
    out = [f"{_name(result)}: what was alive at the peak, by line ({_budget_summary(budgets_per_rank(figs))})"]
    for ranks, ledger, budget in _rank_groups(figs, merge_identical=True):
        mark = _budget_mark(ledger["peak"], budget)
        out.append(f"  {_rank_names(ranks)}: peak {fmt(ledger['peak'], 'bytes')} at tick {ledger['peak_tick']:,}"
                   + (f", {mark}" if mark else ""))
        out += [f"    {line}" for line in _peak_lines(ledger, puzzle_id, top, width=90)] or ["    (nothing alive)"]
    return "\n".join(out)


# ---- schedule


def category(event: dict) -> str:
    """forward, backward, recompute (by label or kind), collective or send/recv."""
    if event["stream"] == "comm":
        return "send/recv" if event["kind"] in _P2P else "collective"
    if "recompute" in event["kind"].lower() or "recompute" in (event.get("label") or "").lower():
        return "recompute"
    return "backward" if event["kind"] == "backward" else "forward"


def idle_gaps(events: list[dict], makespan: int) -> list[tuple[int, int]]:
    """[(start, end)] of the intervals in [0, makespan] where none of `events` (one rank's compute) runs."""
    gaps, t = [], 0
    for e in sorted(events, key=lambda e: e["start"]):
        if e["start"] > t:
            gaps.append((t, e["start"]))
        t = max(t, e["end"])
    if makespan > t:
        gaps.append((t, makespan))
    return gaps


def _ranks_of(figs: dict) -> list[int]:
    ranks = {l["rank"] for l in figs.get("ledgers") or []} | {e["rank"] for e in figs.get("events") or []}
    return sorted(ranks)


# Collectives by a short name, and an abbreviation for bars too narrow for it (the legend spells them out).
COLLECTIVE_NAMES = {
    "all_reduce": ("all_reduce", "AR"),
    "all_gather": ("all_gather", "AG"),
    "all_gather_into_tensor": ("all_gather", "AG"),
    "reduce_scatter_tensor": ("reduce_scatter", "RS"),
    "broadcast": ("broadcast", "BC"),
    "barrier": ("barrier", "B"),
}


def _bar_texts(event: dict) -> tuple[str, ...]:
    """What to print inside an event's bar, longest first; the first that fits is used (or none)."""
    if event.get("label"):
        return (event["label"],)
    if event["stream"] == "comm":
        return COLLECTIVE_NAMES.get(event["kind"], (event["kind"],))
    return ()


def _collective_legend(kinds) -> str:
    names = sorted({COLLECTIVE_NAMES.get(k, (k, ""))[:2] for k in kinds})
    return "collective: " + ", ".join(f"{n} ({a})" if a else n for n, a in names)


def _draw_schedule(ax, figs: dict, xmax: float, axes_width_px: float) -> dict:
    """Draw one result's lanes into `ax`; returns {category: count} of bars drawn."""
    events = figs.get("events") or []
    makespan = int(figs.get("makespan") or 0)
    ranks = _ranks_of(figs)
    has_comm = any(e["stream"] == "comm" for e in events)
    pitch = 1.35 if has_comm else 1.0
    lanes: dict = {}  # (rank, stream) -> y centre
    yticks, ylabels = [], []
    for i, r in enumerate(ranks):
        lanes[(r, "compute")] = i * pitch
        yticks.append(i * pitch)
        ylabels.append(f"rank {r}")
        if has_comm:
            lanes[(r, "comm")] = i * pitch + 0.62
            yticks.append(i * pitch + 0.62)
            ylabels.append("comm")
    heights = {"compute": 0.62, "comm": 0.42}

    bars: dict = {}  # category -> [(y, left, width, height, gid, texts to try)]
    for r in ranks:
        compute = [e for e in events if e["rank"] == r and e["stream"] == "compute"]
        for start, end in idle_gaps(compute, makespan):
            bars.setdefault("idle", []).append((lanes[(r, "compute")], start, end - start, heights["compute"],
                                                f"idle:{r}:compute", ()))
    for e in events:
        cat = category(e)
        bars.setdefault(cat, []).append((lanes[(e["rank"], e["stream"])], e["start"], e["end"] - e["start"],
                                         heights[e["stream"]], f"{cat}:{e['rank']}:{e['stream']}", _bar_texts(e)))

    px_per_tick = axes_width_px / xmax if xmax else 0
    counts = {}
    for cat in COLOURS:  # fixed order, so the legend reads the same on every chart
        rows = bars.get(cat)
        if not rows:
            continue
        counts[cat] = len(rows)
        container = ax.barh([y for y, *_ in rows], [w for _, _, w, *_ in rows], left=[x for _, x, *_ in rows],
                            height=[h for *_, h, _, _ in rows], color=COLOURS[cat],
                            edgecolor=_EDGE.get(cat, "white"), linewidth=0.6, label=cat,
                            zorder=1 if cat == "idle" else 2)
        for patch, row in zip(container.patches, rows):
            patch.set_gid(row[4])
        for y, left, width, height, _gid, texts in rows:
            fits = [(text, size) for text in texts for size in ((7.5, 6.5) if height > 0.5 else (6.5,))
                    if width * px_per_tick >= len(text) * size * 0.62 * DPI / 72 + 3]
            if fits:  # the longest text that fits, at the larger size if it fits at both
                text, size = fits[0]
                ax.text(left + width / 2, y, text, ha="center", va="center", fontsize=size,
                        color=_TEXT_ON.get(cat, "white"), weight="bold", zorder=3, clip_on=True)

    if makespan:
        ax.axvline(makespan, color="black", linestyle=":", linewidth=1.1, zorder=4)
    for r in ranks:  # the compute stream's idle share, at the right edge of each rank's lane
        busy = sum(e["end"] - e["start"] for e in events if e["rank"] == r and e["stream"] == "compute")
        if makespan:
            ax.text(1.005, lanes[(r, "compute")], f"idle {100 * (1 - busy / makespan):.0f}%", fontsize=8,
                    va="center", ha="left", color="#555555", transform=ax.get_yaxis_transform(), clip_on=False)
    ax.set_yticks(yticks, ylabels)
    for label in ax.get_yticklabels():
        if label.get_text() == "comm":
            label.set_fontsize(7.5)
            label.set_color("#666666")
        else:
            label.set_fontsize(9)
    top = max(lanes.values()) if lanes else 0
    ax.set_ylim(top + 0.55, -0.55)  # rank 0 on top
    ax.set_xlim(0, xmax)
    ax.xaxis.set_major_formatter(_ticks_formatter)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(True, axis="x", color="#DDDDDD", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    return counts


def _schedule_handles(categories, figs_list) -> list:
    kinds = {e["kind"] for figs in figs_list for e in figs.get("events") or [] if category(e) == "collective"}
    names = dict(LEGEND_NAMES, collective=_collective_legend(kinds))
    handles = [Patch(facecolor=COLOURS[c], edgecolor=_EDGE.get(c, "none") if c != "idle" else "#999999",
                     label=names[c]) for c in COLOURS if c in categories]
    handles.append(Line2D([], [], color="black", linestyle=":", label="makespan"))
    return handles


def _idle_share(figs: dict) -> float:
    events, makespan, ranks = figs.get("events") or [], figs.get("makespan") or 0, _ranks_of(figs)
    if not makespan or not ranks:
        return 0.0
    busy = sum(e["end"] - e["start"] for e in events if e["stream"] == "compute")
    return 1 - busy / (makespan * len(ranks))


def _schedule_height(figs: dict) -> float:
    """Inches for one result's lanes."""
    n = len(_ranks_of(figs))
    has_comm = any(e["stream"] == "comm" for e in figs.get("events") or [])
    return n * (0.62 if has_comm else 0.42) + 0.3


_AXES_WIDTH_PX = (FIG_WIDTH - _LEFT_IN - _RIGHT_IN) * DPI


def schedule_figure(result) -> Figure:
    """The clock's events as a Gantt chart: per rank a compute lane and a comm lane, idle gaps in grey,
    record_function labels ('F3', 'B3') printed inside the bars wide enough to hold them."""
    figs = _figures(result)
    if not figs.get("events"):
        return _no_data_figure(result, "schedule")
    makespan = int(figs.get("makespan") or 0)
    height = _TOP_IN + _BOTTOM_IN + _schedule_height(figs)
    fig = _new_figure(FIG_WIDTH, height)
    fig.subplots_adjust(**_margins(height))
    ax = fig.add_subplot()
    counts = _draw_schedule(ax, figs, max(makespan, 1) * 1.01, _AXES_WIDTH_PX)
    ax.set_xlabel("simulated time (ticks)", fontsize=9.5)
    _head(fig, height, f"{_name(result)}{_status(result)}: schedule; makespan {makespan:,} ticks, compute idle "
                       f"{100 * _idle_share(figs):.0f}% (mean over ranks)", _schedule_handles(counts, [figs]))
    return fig


def comparison_figure(a, b, titles=None, what: str = "schedule") -> Figure:
    """Two results on one time axis, `a` above `b`: what="schedule" (GPipe vs 1F1B, synchronous vs overlapped
    all-reduce) or what="memory" (both timelines overlaid per rank, e.g. stage 0's peak under GPipe and 1F1B).
    `titles`: a name for each (default: the puzzle's id and title)."""
    titles = list(titles) if titles else [_name(a), _name(b)]
    fa, fb = _figures(a), _figures(b)
    if what == "memory":
        return _memory_comparison(fa, fb, titles)
    if what != "schedule":
        raise ValueError(f"what must be 'schedule' or 'memory', not {what!r}")
    for r, f, t in ((a, fa, titles[0]), (b, fb, titles[1])):
        if not f.get("events"):
            return _no_data_figure(r, f"schedule for {t}")
    ma, mb = int(fa.get("makespan") or 0), int(fb.get("makespan") or 0)
    ha, hb = _schedule_height(fa), _schedule_height(fb)
    gap = 0.55  # the second panel's title
    height = _TOP_IN + 0.25 + _BOTTOM_IN + ha + gap + hb
    fig = _new_figure(FIG_WIDTH, height)
    axes = fig.subplots(2, 1, sharex=True, height_ratios=[ha, hb],
                        gridspec_kw=dict(hspace=gap / ((ha + hb) / 2), **_margins(height, top=_TOP_IN + 0.25)))
    xmax = max(ma, mb, 1) * 1.01
    categories = set()
    for ax, figs, title, makespan in zip(axes, (fa, fb), titles, (ma, mb)):
        categories |= set(_draw_schedule(ax, figs, xmax, _AXES_WIDTH_PX))
        ax.set_title(f"{title}: makespan {makespan:,} ticks, compute idle {100 * _idle_share(figs):.0f}%",
                     fontsize=10, loc="left", weight="bold")
    axes[0].tick_params(labelbottom=True)
    axes[1].set_xlabel("simulated time (ticks)", fontsize=9.5)
    verdict = f": {titles[1]} takes {mb / ma:.2f}x the time of {titles[0]}" if ma and mb else ""
    _head(fig, height, f"{titles[0]} vs {titles[1]}{verdict}", _schedule_handles(categories, [fa, fb]))
    return fig


def _memory_comparison(fa: dict, fb: dict, titles) -> Figure:
    la, lb = fa.get("ledgers") or [], fb.get("ledgers") or []
    if not la and not lb:
        return _no_data_figure(None, "memory timeline")
    ba, bb = budgets_per_rank(fa), budgets_per_rank(fb)
    groups: dict = {}  # ranks whose timelines and budgets are identical in both results share a panel
    for r in range(max(len(la), len(lb))):
        pair = (la[r] if r < len(la) else None, lb[r] if r < len(lb) else None)
        limits = sorted({ba[r] if r < len(ba) else None, bb[r] if r < len(bb) else None} - {None})
        key = (_ledger_key(pair[0]), _ledger_key(pair[1]), tuple(limits))
        groups.setdefault(key, ([], pair, limits))[0].append(r)
    rows = list(groups.values())
    n = len(rows)
    budgets = {b for b in ba + bb if b is not None}
    end = max(int(fa.get("makespan") or 0), int(fb.get("makespan") or 0), 1)
    top_bytes = max([l["peak"] for l in la + lb] + list(budgets) + [1])
    unit, scale = byte_unit(top_bytes)
    colours = (MEMORY_LINE, "#E45756")
    row_h = 1.4 if n <= 4 else 1.1
    height = _TOP_IN + _BOTTOM_IN + row_h * n
    fig = _new_figure(FIG_WIDTH, height)
    axes = fig.subplots(n, 1, sharex=True, sharey=True, squeeze=False,
                        gridspec_kw=dict(hspace=0.12, **_margins(height, right=0.3)))[:, 0]
    for (ranks, pair, limits), ax in zip(rows, axes):
        for ledger, colour, title, figs in zip(pair, colours, titles, (fa, fb)):
            if ledger is None:
                continue
            xs, ys = _step_xy(ledger["timeline"], int(figs.get("makespan") or 0), scale)
            ax.step(xs, ys, where="post", color=colour, linewidth=1.3, label=title, gid="memory")
            ax.plot([ledger["peak_tick"]], [ledger["peak"] / scale], marker="v", markersize=7, color=colour,
                    linestyle="none", gid="peak")
        for budget in limits:
            ax.axhline(budget / scale, color=BUDGET_COLOUR, linestyle="--", linewidth=1.1, gid="budget")
        peaks = "    ".join(f"{t}: {human_bytes(l['peak'])}" for t, l in zip(titles, pair) if l is not None)
        ax.text(0.995, 0.94, f"peak  {peaks}", transform=ax.transAxes, ha="right", va="top", fontsize=8.5,
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5))
        ax.set_ylabel(f"{_rank_names(ranks)}\n({unit})", fontsize=9.5, rotation=0, ha="right", va="center",
                      labelpad=6)
        ax.grid(True, color="#DDDDDD", linewidth=0.6)
        ax.tick_params(labelsize=8)
    axes[0].set_xlim(0, end * 1.01)
    axes[0].set_ylim(0, top_bytes / scale * 1.25)
    axes[0].xaxis.set_major_formatter(_ticks_formatter)
    axes[-1].set_xlabel("simulated time (ticks)", fontsize=9.5)
    handles = [Line2D([], [], color=c, linewidth=1.5, label=f"{t} ({unit} alive)")
               for c, t in zip(colours, titles)]
    if budgets:
        handles.append(Line2D([], [], color=BUDGET_COLOUR, linestyle="--",
                              label="budget " + ", ".join(human_bytes(b) for b in sorted(budgets))))
    handles.append(Line2D([], [], marker="v", color="black", linestyle="none", label="peak (first reached)"))
    _head(fig, height, f"{titles[0]} vs {titles[1]}: memory per rank", handles)
    return fig


# ---- files


def save(fig: Figure, path) -> Path:
    """Write `fig` as a PNG and release what it drew."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, pil_kwargs=_PNG if path.suffix.lower() == ".png" else None)
    fig.clear()
    return path


def write_plots(result, directory, prefix: str | None = None) -> list[Path]:
    """Write `{id}_memory.png` and `{id}_schedule.png` for one graded result into `directory`; returns the paths
    (none for a result that did not run: an error or a puzzle not attempted)."""
    figs = _figures(result)
    if not figs:
        return []
    prefix = prefix if prefix is not None else (_get(result, "id") or "result")
    directory = Path(directory)
    return [save(memory_figure(result), directory / f"{prefix}_memory.png"),
            save(schedule_figure(result), directory / f"{prefix}_schedule.png")]
