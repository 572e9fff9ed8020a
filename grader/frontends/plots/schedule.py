"""The schedule: a Gantt chart of each rank's compute and comm streams, idle gaps, labels; and two results'
schedules on one time axis."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .canvas import (
    BOTTOM_IN,
    COLOURS,
    DPI,
    EDGE,
    FIG_WIDTH,
    LEFT_IN,
    LEGEND_NAMES,
    P2P,
    RIGHT_IN,
    TEXT_ON,
    TOP_IN,
    field,
    figures_of,
    margins,
    new_figure,
    no_data_figure,
    status_note,
    ticks_formatter,
    title_and_legend,
    title_of,
)
from .memory import memory_comparison

_AXES_WIDTH_PX = (FIG_WIDTH - LEFT_IN - RIGHT_IN) * DPI


def category(event: dict) -> str:
    """forward, backward, recompute (by label or kind), disk (a checkpoint's i/o), collective or send/recv; on a
    Part IV host's tracks: sync (the host waits for the device), loading (a batch loaded, by the host or a worker)
    or waiting for data (the host waits for a worker's batch)."""
    if event["stream"] == "comm":
        return "send/recv" if event["kind"] in P2P else "collective"
    if event["stream"] in ("host", "loader"):
        return {"sync": "sync", "wait for data": "waiting for data"}.get(event["kind"], "loading")
    if event["kind"] == "io":
        return "disk"
    if "recompute" in event["kind"].lower() or "recompute" in (event.get("label") or "").lower():
        return "recompute"
    return "backward" if event["kind"] == "backward" else "forward"


def lane_of(event: dict) -> tuple:
    """The lane an event is drawn in, within its rank: ("compute",), ("comm",), ("host",) or ("loader", worker)."""
    if event["stream"] == "loader":
        return ("loader", (event.get("peers") or (0,))[0])
    return (event["stream"],)


def sub_lanes(events: list[dict]) -> list[tuple]:
    """The lanes each rank gets, top to bottom: compute, then comm, host and each loader worker where any rank
    has such events (every rank the same lanes, so ranks line up)."""
    seen = {lane_of(e) for e in events}
    return ([("compute",)] + [lane for lane in (("comm",), ("host",)) if lane in seen]
            + sorted(lane for lane in seen if lane[0] == "loader"))


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
    subs = sub_lanes(events)
    pitch = 1.0 if len(subs) == 1 else 0.62 * len(subs) + 0.11
    lanes: dict = {}  # (rank, lane) -> y centre
    yticks, ylabels = [], []
    for i, r in enumerate(ranks):
        for k, lane in enumerate(subs):
            lanes[(r, lane)] = i * pitch + 0.62 * k
            yticks.append(i * pitch + 0.62 * k)
            ylabels.append(f"rank {r}" if k == 0 else lane[0] if len(lane) == 1 else f"loader {lane[1]}")
    heights = {"compute": 0.62, "comm": 0.42, "host": 0.42, "loader": 0.42}

    bars: dict = {}  # category -> [(y, left, width, height, gid, texts to try)]
    for r in ranks:
        compute = [e for e in events if e["rank"] == r and e["stream"] == "compute"]
        for start, end in idle_gaps(compute, makespan):
            bars.setdefault("idle", []).append((lanes[(r, ("compute",))], start, end - start, heights["compute"],
                                                f"idle:{r}:compute", ()))
    for e in events:
        cat = category(e)
        bars.setdefault(cat, []).append((lanes[(e["rank"], lane_of(e))], e["start"], e["end"] - e["start"],
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
                            edgecolor=EDGE.get(cat, "white"), linewidth=0.6, label=cat,
                            zorder=1 if cat == "idle" else 2)
        for patch, row in zip(container.patches, rows):
            patch.set_gid(row[4])
        for y, left, width, height, _gid, texts in rows:
            fits = [(text, size) for text in texts for size in ((7.5, 6.5) if height > 0.5 else (6.5,))
                    if width * px_per_tick >= len(text) * size * 0.62 * DPI / 72 + 3]
            if fits:  # the longest text that fits, at the larger size if it fits at both
                text, size = fits[0]
                ax.text(left + width / 2, y, text, ha="center", va="center", fontsize=size,
                        color=TEXT_ON.get(cat, "white"), weight="bold", zorder=3, clip_on=True)

    if makespan:
        ax.axvline(makespan, color="black", linestyle=":", linewidth=1.1, zorder=4)
    for r in ranks:  # the compute stream's idle share, at the right edge of each rank's lane
        busy = sum(e["end"] - e["start"] for e in events if e["rank"] == r and e["stream"] == "compute")
        if makespan:
            ax.text(1.005, lanes[(r, ("compute",))], f"idle {100 * (1 - busy / makespan):.0f}%", fontsize=8,
                    va="center", ha="left", color="#555555", transform=ax.get_yaxis_transform(), clip_on=False)
    ax.set_yticks(yticks, ylabels)
    for label in ax.get_yticklabels():
        if not label.get_text().startswith("rank "):
            label.set_fontsize(7.5)
            label.set_color("#666666")
        else:
            label.set_fontsize(9)
    top = max(lanes.values()) if lanes else 0
    ax.set_ylim(top + 0.55, -0.55)  # rank 0 on top
    ax.set_xlim(0, xmax)
    ax.xaxis.set_major_formatter(ticks_formatter)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(True, axis="x", color="#DDDDDD", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    return counts


def _schedule_handles(categories, figs_list) -> list:
    kinds = {e["kind"] for figs in figs_list for e in figs.get("events") or [] if category(e) == "collective"}
    names = dict(LEGEND_NAMES, collective=_collective_legend(kinds))
    handles = [Patch(facecolor=COLOURS[c], edgecolor=EDGE.get(c, "none") if c != "idle" else "#999999",
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
    return n * (0.42 + 0.2 * (len(sub_lanes(figs.get("events") or [])) - 1)) + 0.3


def _about_time(result) -> bool:
    """Whether the puzzle grades time (a budget in ticks, or a bubble): only then does the idle share matter. A
    figures dict alone (no checks) counts as about time."""
    checks = field(result, "checks", None)
    if not checks:
        return True
    units = [(c.get("budget") or {}).get("unit") if isinstance(c, dict) else getattr(c.budget, "unit", None)
             for c in checks]
    names = [c.get("name") if isinstance(c, dict) else c.name for c in checks]
    return "ticks" in units or "bubble" in names or "makespan" in names


def schedule_figure(result) -> Figure:
    """The clock's events as a Gantt chart: per rank a compute lane and a comm lane, idle gaps in grey,
    record_function labels ('F3', 'B3') printed inside the bars wide enough to hold them."""
    figs = figures_of(result)
    if not figs.get("events"):
        return no_data_figure(result, "schedule")
    makespan = int(figs.get("makespan") or 0)
    height = TOP_IN + BOTTOM_IN + _schedule_height(figs)
    fig = new_figure(FIG_WIDTH, height)
    fig.subplots_adjust(**margins(height))
    ax = fig.add_subplot()
    counts = _draw_schedule(ax, figs, max(makespan, 1) * 1.01, _AXES_WIDTH_PX)
    ax.set_xlabel("simulated time (ticks)", fontsize=9.5)
    if _about_time(result):
        title = (f"{title_of(result)}{status_note(result)}: schedule; makespan {makespan:,} ticks, compute idle "
                 f"{100 * _idle_share(figs):.0f}% (mean over ranks)")
    else:  # idle time is not what this puzzle grades: a big idle share here is the cost model, not a mistake
        title = (f"{title_of(result)}{status_note(result)}: schedule; makespan {makespan:,} ticks "
                 f"(for reading only: time is not graded in this puzzle)")
    title_and_legend(fig, height, title, _schedule_handles(counts, [figs]))
    return fig


def comparison_figure(a, b, titles=None, what: str = "schedule") -> Figure:
    """Two results on one time axis, `a` above `b`: what="schedule" (GPipe vs 1F1B, synchronous vs overlapped
    all-reduce) or what="memory" (both timelines overlaid per rank, e.g. stage 0's peak under GPipe and 1F1B).
    `titles`: a name for each (default: the puzzle's id and title)."""
    titles = list(titles) if titles else [title_of(a), title_of(b)]
    fa, fb = figures_of(a), figures_of(b)
    if what == "memory":
        return memory_comparison(fa, fb, titles)
    if what != "schedule":
        raise ValueError(f"what must be 'schedule' or 'memory', not {what!r}")
    for r, f, t in ((a, fa, titles[0]), (b, fb, titles[1])):
        if not f.get("events"):
            return no_data_figure(r, f"schedule for {t}")
    ma, mb = int(fa.get("makespan") or 0), int(fb.get("makespan") or 0)
    ha, hb = _schedule_height(fa), _schedule_height(fb)
    gap = 0.55  # the second panel's title
    height = TOP_IN + 0.25 + BOTTOM_IN + ha + gap + hb
    fig = new_figure(FIG_WIDTH, height)
    axes = fig.subplots(2, 1, sharex=True, height_ratios=[ha, hb],
                        gridspec_kw=dict(hspace=gap / ((ha + hb) / 2), **margins(height, top=TOP_IN + 0.25)))
    xmax = max(ma, mb, 1) * 1.01
    categories = set()
    for ax, figs, title, makespan in zip(axes, (fa, fb), titles, (ma, mb)):
        categories |= set(_draw_schedule(ax, figs, xmax, _AXES_WIDTH_PX))
        ax.set_title(f"{title}: makespan {makespan:,} ticks, compute idle {100 * _idle_share(figs):.0f}%",
                     fontsize=10, loc="left", weight="bold")
    axes[0].tick_params(labelbottom=True)
    axes[1].set_xlabel("simulated time (ticks)", fontsize=9.5)
    verdict = f": {titles[1]} takes {mb / ma:.2f}x the time of {titles[0]}" if ma and mb else ""
    title_and_legend(fig, height, f"{titles[0]} vs {titles[1]}{verdict}", _schedule_handles(categories, [fa, fb]))
    return fig
