"""Memory over simulated time: one panel per rank (identical ranks merged), the budget, the peak and what was
alive at it; the same as console text (peak_table); and two results' timelines overlaid."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ...core.result import fmt
from .canvas import (BOTTOM_IN, BUDGET_COLOUR, FIG_WIDTH, MEMORY_LINE, TOP_IN, byte_unit, field, figures_of,
                     human_bytes, margins, new_figure, no_data_figure, rank_names, short_site, status_note,
                     ticks_formatter, title_and_legend, title_of)


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
    out = [f"{human_bytes(r['bytes']):>10}  x{r['count']:<3} {short_site(r['site'], puzzle_id, width)}"
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
    figs = figures_of(result)
    ledgers = figs.get("ledgers") or []
    if not ledgers:
        return no_data_figure(result, "memory timeline")
    budgets = budgets_per_rank(figs)
    makespan = int(figs.get("makespan") or 0)
    puzzle_id = field(result, "id")
    groups = _rank_groups(figs, merge_identical)
    n = len(groups)
    end = max([makespan] + [l["timeline"][-1][0] for l in ledgers if l["timeline"]] + [1])
    top_bytes = max([l["peak"] for l in ledgers] + [b for b in budgets if b is not None] + [1])
    unit, scale = byte_unit(top_bytes)

    row_h = 1.55 if n <= 4 else 1.2
    height = TOP_IN + BOTTOM_IN + row_h * n
    fig = new_figure(FIG_WIDTH, height)
    gs = fig.add_gridspec(n, 2, width_ratios=[1.6, 1], wspace=0.03, hspace=0.12, **margins(height, right=0.1))
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
        ax.set_ylabel(f"{rank_names(ranks)}\n({unit})", fontsize=9.5, rotation=0, ha="right", va="center",
                      labelpad=6)
        ax.grid(True, axis="both", color="#DDDDDD", linewidth=0.6)
        ax.tick_params(labelsize=8)
        if i < n - 1:
            ax.tick_params(labelbottom=False)

        text_ax = fig.add_subplot(gs[i, 1])
        text_ax.axis("off")
        head = f"{rank_names(ranks)}: peak {human_bytes(ledger['peak'])} at tick {ledger['peak_tick']:,}"
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
    axes[0].xaxis.set_major_formatter(ticks_formatter)
    axes[-1].set_xlabel("simulated time (ticks)", fontsize=9.5)
    handles = [Line2D([], [], color=MEMORY_LINE, linewidth=1.5, label=f"bytes alive on the rank ({unit})")]
    values = {b for b in budgets if b is not None}
    if values:
        label = f"budget {human_bytes(values.pop())}" if len(values) == 1 else "budget"
        handles.append(Line2D([], [], color=BUDGET_COLOUR, linestyle="--", label=label))
    handles.append(Line2D([], [], marker="v", color="black", linestyle="none", label="peak (first reached)"))
    title = f"{title_of(result)}{status_note(result)}: memory per rank ({_budget_summary(budgets)})"
    title_and_legend(fig, height, title, handles)
    return fig


def peak_table(result, top: int = 6) -> str:
    """What was alive at each rank's peak, by the learner's line, as console text (identical ranks merged)."""
    figs = figures_of(result)
    if not figs.get("ledgers"):
        return f"{title_of(result)}: no memory data"
    puzzle_id = field(result, "id")
    out = [f"{title_of(result)}: what was alive at the peak, by line ({_budget_summary(budgets_per_rank(figs))})"]
    for ranks, ledger, budget in _rank_groups(figs, merge_identical=True):
        mark = _budget_mark(ledger["peak"], budget)
        out.append(f"  {rank_names(ranks)}: peak {fmt(ledger['peak'], 'bytes')} at tick {ledger['peak_tick']:,}"
                   + (f", {mark}" if mark else ""))
        out += [f"    {line}" for line in _peak_lines(ledger, puzzle_id, top, width=90)] or ["    (nothing alive)"]
    return "\n".join(out)


def memory_comparison(fa: dict, fb: dict, titles) -> Figure:
    la, lb = fa.get("ledgers") or [], fb.get("ledgers") or []
    if not la and not lb:
        return no_data_figure(None, "memory timeline")
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
    height = TOP_IN + BOTTOM_IN + row_h * n
    fig = new_figure(FIG_WIDTH, height)
    axes = fig.subplots(n, 1, sharex=True, sharey=True, squeeze=False,
                        gridspec_kw=dict(hspace=0.12, **margins(height, right=0.3)))[:, 0]
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
        ax.set_ylabel(f"{rank_names(ranks)}\n({unit})", fontsize=9.5, rotation=0, ha="right", va="center",
                      labelpad=6)
        ax.grid(True, color="#DDDDDD", linewidth=0.6)
        ax.tick_params(labelsize=8)
    axes[0].set_xlim(0, end * 1.01)
    axes[0].set_ylim(0, top_bytes / scale * 1.25)
    axes[0].xaxis.set_major_formatter(ticks_formatter)
    axes[-1].set_xlabel("simulated time (ticks)", fontsize=9.5)
    handles = [Line2D([], [], color=c, linewidth=1.5, label=f"{t} ({unit} alive)")
               for c, t in zip(colours, titles)]
    if budgets:
        handles.append(Line2D([], [], color=BUDGET_COLOUR, linestyle="--",
                              label="budget " + ", ".join(human_bytes(b) for b in sorted(budgets))))
    handles.append(Line2D([], [], marker="v", color="black", linestyle="none", label="peak (first reached)"))
    title_and_legend(fig, height, f"{titles[0]} vs {titles[1]}: memory per rank", handles)
    return fig
