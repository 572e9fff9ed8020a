"""The plots (grader/frontends/plots/): each function draws the artists its data calls for. Assertions are on the figure
objects (bars, lines, texts, legends), never on pixels; one real result (p3's reference, seed 0) and synthetic
figures data (a pipeline with microbatch labels, a recompute, and an all-reduce overlapped with the backward)."""

import json

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from grader.core.result import ERROR, PASS, PuzzleResult
from grader.frontends import plots
from grader.frontends.targets import REPO, grade_target

MiB = 1 << 20
BACKWARD_LINE = next(f"line {i}: loss.backward()" for i, line in  # where p3's reference calls backward
                     enumerate((REPO / "solutions" / "p3_data_parallel.py").read_text().splitlines(), 1)
                     if line.strip() == "loss.backward()")


# ---- data


@pytest.fixture(scope="module")
def p3():
    [result] = grade_target("solutions", ["p3"], seed=0)
    assert result.status == PASS and result.figures
    return result


def _event(rank, stream, kind, start, end, label="", phase="", peers=(), site=""):
    return {"rank": rank, "stream": stream, "kind": kind, "start": start, "end": end, "flops": 0, "nbytes": 0,
            "wire_bytes": 0, "label": label, "phase": phase, "peers": peers, "site": site, "ops": 1}


def synthetic_pipeline(ranks=4, micro=4, budget=3 * MiB, recompute=True, overlap=True):
    """A GPipe-like schedule: microbatch i's forward on stage r at (r + i)*F, its activation sent on the comm
    lane, then the backwards in reverse; with `recompute`, a recompute block before every backward; with
    `overlap`, an async all_reduce of the gradients on the comm lane while the last backward runs."""
    F, B, R, S = 100, 200, 100, 30
    events, ledgers = [], []
    fwd_end = (ranks - 1 + micro) * F
    makespan = 0
    for r in range(ranks):
        t = 0
        for i in range(micro):
            start = (r + i) * F
            events.append(_event(r, "compute", "forward", start, start + F, f"F{i}"))
            if r < ranks - 1:
                events.append(_event(r, "comm", "send", start + F, start + F + S, f"F{i}", "forward", (r, r + 1)))
            t = start + F
        t = fwd_end + (ranks - 1 - r) * (B + (R if recompute else 0))
        comm_free = 0  # one comm stream per rank: its messages queue
        for i in reversed(range(micro)):
            if recompute:
                events.append(_event(r, "compute", "forward", t, t + R, "recompute"))
                t += R
            if overlap and i == 0:  # the gradients' all-reduce runs while the last backward computes
                start = max(t, comm_free)
                comm_free = t + B + 50
                events.append(_event(r, "comm", "all_reduce", start, comm_free, "", "backward", tuple(range(ranks)),
                                     "p9_x.py:12: dist.all_reduce(g, async_op=True)"))
            events.append(_event(r, "compute", "backward", t, t + B, f"B{i}"))
            t += B
            if r > 0:
                start = max(t, comm_free)
                comm_free = start + S
                events.append(_event(r, "comm", "send", start, comm_free, f"B{i}", "backward", (r, r - 1)))
        t = max(t, comm_free)
        makespan = max(makespan, t)
        peak_tick = (r + micro - 1) * F
        peak = (r + 2) * MiB // 2
        timeline = [[0, 0], [0, MiB // 4]] + [[(r + i) * F, MiB // 4 + (i + 1) * (peak - MiB // 4) // micro]
                                              for i in range(micro)] + [[t, MiB // 4]]
        ledgers.append({"rank": r, "peak": peak, "peak_tick": peak_tick, "timeline": timeline,
                        "peak_by_line": [{"site": "p9_x.py:7: y = forward(a, layers)", "bytes": peak - MiB // 4,
                                          "count": micro * 4},
                                         {"site": "input placed on the rank by sim.run", "bytes": MiB // 4,
                                          "count": 2}]})
    events.sort(key=lambda e: (e["start"], e["rank"], e["stream"], e["end"]))
    figures = {"ledgers": ledgers, "memory_budget": budget, "events": events, "makespan": makespan}
    return PuzzleResult("p9", "x", "Synthetic pipeline", PASS, [], [l["peak"] for l in ledgers], makespan,
                        figures=figures)


def _bars(fig: Figure, ax=None) -> list[Rectangle]:
    axes = [ax] if ax is not None else fig.axes
    return [p for a in axes for p in a.patches if isinstance(p, Rectangle) and p.get_gid()]


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts]


def _legend_labels(fig: Figure) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


# ---- memory


def test_memory_figure_on_p3_merges_identical_ranks(p3):
    fig = plots.memory_figure(p3)
    plot_axes = [ax for ax in fig.axes if ax.lines]
    assert len(plot_axes) == 1  # the four data-parallel ranks are identical: one panel
    assert plot_axes[0].get_ylabel().startswith("ranks 0-3")
    assert "(MiB)" in plot_axes[0].get_ylabel()
    assert plot_axes[0].get_xlabel() == "simulated time (ticks)"
    assert not [l for l in plot_axes[0].lines if l.get_gid() == "budget"]  # p3 has no memory budget
    assert any(BACKWARD_LINE in t for t in _texts(fig))  # the peak's contents, by the learner's line
    assert "bytes alive on the rank (MiB)" in _legend_labels(fig)


def test_memory_figure_one_panel_per_rank_with_peak_marked(p3):
    fig = plots.memory_figure(p3, merge_identical=False)
    plot_axes = [ax for ax in fig.axes if ax.lines]
    assert len(plot_axes) == 4
    for ax, ledger in zip(plot_axes, p3.figures["ledgers"]):
        [memory] = [l for l in ax.lines if l.get_gid() == "memory"]
        xs, ys = memory.get_data()
        assert xs[-1] == p3.figures["makespan"]  # held to the end of the run
        assert max(ys) == pytest.approx(ledger["peak"] / MiB)
        [peak] = [l for l in ax.lines if l.get_gid() == "peak"]
        assert list(peak.get_xdata()) == [ledger["peak_tick"]]
        assert list(peak.get_ydata()) == pytest.approx([ledger["peak"] / MiB])


def test_memory_figure_draws_the_budget_and_flags_ranks_over_it():
    result = synthetic_pipeline(budget=3 * MiB // 2)
    fig = plots.memory_figure(result)
    plot_axes = [ax for ax in fig.axes if ax.lines]
    assert len(plot_axes) == 4  # pipeline stages differ: one panel each
    for ax in plot_axes:
        [budget] = [l for l in ax.lines if l.get_gid() == "budget"]
        assert list(budget.get_ydata()) == pytest.approx([1.5, 1.5])  # in MiB
    over = [t for t in _texts(fig) if "% of budget" in t]
    assert len(over) == 4 and "rank 3: peak 2.50 MiB at tick 600" in over[3] and "(167% of budget)" in over[3]
    assert any(t.startswith("budget 1.50 MiB") for t in _legend_labels(fig))


def test_a_budget_on_some_ranks_only():
    result = synthetic_pipeline(budget=[MiB, None, None, None])  # say, a limit on stage 0's memory
    fig = plots.memory_figure(result)
    plot_axes = [ax for ax in fig.axes if ax.lines]
    assert [len([l for l in ax.lines if l.get_gid() == "budget"]) for ax in plot_axes] == [1, 0, 0, 0]
    assert any("budget rank 0: 1.00 MiB" in t for t in _texts(fig))
    assert "rank 0: peak 1,048,576 bytes (1.00 MiB) at tick 300, 100% of budget 1.00 MiB" in plots.peak_table(result)
    compare = plots.comparison_figure(result, synthetic_pipeline(budget=None), what="memory")
    assert [len([l for l in ax.lines if l.get_gid() == "budget"]) for ax in compare.axes] == [1, 0, 0, 0]


def test_byte_units_are_chosen_by_size():
    assert plots.byte_unit(3 * MiB) == ("MiB", MiB)
    assert plots.byte_unit(5000) == ("KiB", 1024)
    assert plots.byte_unit(100) == ("bytes", 1)
    assert plots.human_bytes(2236424) == "2.13 MiB" and plots.human_bytes(131072) == "128.0 KiB"
    assert plots.human_bytes(8) == "8 B"


def test_peak_table(p3):
    table = plots.peak_table(p3)
    lines = table.splitlines()
    assert lines[0].startswith("p3 Data parallel: what was alive at the peak")
    assert "ranks 0-3: peak 2,236,424 bytes (2.13 MiB) at tick" in lines[1]
    assert "input placed on the rank by sim.run" in lines[2]  # largest first
    assert any(BACKWARD_LINE in l for l in lines)
    over = plots.peak_table(synthetic_pipeline(budget=MiB))
    assert "rank 3: peak 2,621,440 bytes (2.50 MiB)" in over and "250% of budget 1.00 MiB, OVER" in over


# ---- schedule


def _check_bars_match_events(ax_or_fig, figures, fig=None):
    bars = _bars(fig, ax_or_fig) if fig is not None else _bars(ax_or_fig)
    for r in {e["rank"] for e in figures["events"]}:
        for stream in ("compute", "comm"):
            events = [e for e in figures["events"] if e["rank"] == r and e["stream"] == stream]
            drawn = [b for b in bars if b.get_gid().endswith(f":{r}:{stream}") and not b.get_gid().startswith("idle")]
            assert len(drawn) == len(events), (r, stream)
            assert sorted((b.get_x(), b.get_width()) for b in drawn) == \
                sorted((e["start"], e["end"] - e["start"]) for e in events)
        compute = [e for e in figures["events"] if e["rank"] == r and e["stream"] == "compute"]
        idle = [b for b in bars if b.get_gid() == f"idle:{r}:compute"]
        assert len(idle) == len(plots.idle_gaps(compute, figures["makespan"]))


def test_schedule_figure_on_p3(p3):
    fig = plots.schedule_figure(p3)
    [ax] = fig.axes
    _check_bars_match_events(fig, p3.figures)
    assert ax.get_xlabel() == "simulated time (ticks)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "comm", "rank 1", "comm", "rank 2", "comm",
                                                           "rank 3", "comm"]
    assert _legend_labels(fig) == ["forward", "backward", "collective: all_reduce (AR)", "idle (compute stream)",
                                   "makespan"]
    assert "AR" in _texts(fig)  # the comm bars, narrower than the compute on the roofline, get the short name
    assert any(f"makespan {p3.makespan_ticks:,} ticks" in t for t in _texts(fig))


@pytest.mark.parametrize("extra", [0, 400])
def test_a_long_title_stays_inside_the_figure(p3, extra):
    """p21's title ran off the right edge: a long title is set smaller, and cut with an ellipsis past that."""
    import dataclasses

    long = dataclasses.replace(p3, title=p3.title + " (and a much longer subtitle)" + " x" * (extra // 2))
    fig = plots.schedule_figure(long)
    title = fig.texts[0]
    box = title.get_window_extent(fig.canvas.get_renderer())
    assert box.x1 <= fig.bbox.width, (box.x1, fig.bbox.width, title.get_text())
    assert title.get_fontsize() >= 8.0
    assert title.get_text().endswith("\u2026") == (extra == 400), title.get_text()


def test_schedule_figure_pipeline_labels_recompute_and_overlap():
    result = synthetic_pipeline()
    fig = plots.schedule_figure(result)
    [ax] = fig.axes
    _check_bars_match_events(fig, result.figures)
    texts = _texts(fig)
    for i in range(4):  # microbatch numbers inside the blocks (every block is wide enough here)
        assert texts.count(f"F{i}") >= 4 and texts.count(f"B{i}") >= 4
    assert "recompute" not in texts  # 100 ticks of ~3,200 are too narrow for the word
    small = synthetic_pipeline(ranks=2, micro=2)  # ~1,250 ticks: now they hold it
    assert _texts(plots.schedule_figure(small)).count("recompute") == 4
    labels = _legend_labels(fig)
    assert {"forward", "backward", "recompute", "send / recv", "collective: all_reduce (AR)",
            "idle (compute stream)"} <= set(labels)
    colours = {b.get_gid().split(":")[0]: b.get_facecolor() for b in _bars(fig)}
    assert len(set(colours.values())) == len(colours)  # each category its own colour
    # the all-reduce lies on rank 0's comm lane, below its compute lane, overlapping a backward in time
    bars = _bars(fig)
    [ar] = [b for b in bars if b.get_gid() == "collective:0:comm"]
    backs = [b for b in bars if b.get_gid() == "backward:0:compute"]
    assert any(b.get_x() < ar.get_x() + ar.get_width() and ar.get_x() < b.get_x() + b.get_width() for b in backs)
    assert ar.get_y() > backs[0].get_y()  # lanes run downward: rank 0's comm lane sits under its compute lane
    # the compute lane of a stage waits for the pipeline to fill: idle from 0 on every stage but the first
    assert [b for b in bars if b.get_gid() == "idle:3:compute"][0].get_x() == 0


def test_narrow_bars_get_no_label():
    result = synthetic_pipeline()
    figures = dict(result.figures, makespan=result.figures["makespan"] * 100)  # every block now ~1 px wide
    fig = plots.schedule_figure(figures)
    assert not {"F0", "B0", "recompute"} & set(_texts(fig))


def test_comparison_figure_shares_the_time_axis(p3):
    slow = synthetic_pipeline(recompute=True, overlap=False)
    fast = synthetic_pipeline(recompute=False, overlap=True)
    fig = plots.comparison_figure(slow, fast, ("with recompute", "without"))
    top, bottom = fig.axes
    assert top.get_xlim() == bottom.get_xlim()
    assert top.get_xlim()[1] >= max(slow.makespan_ticks, fast.makespan_ticks)
    assert f"with recompute: makespan {slow.makespan_ticks:,} ticks" in top.get_title(loc="left")
    assert f"without: makespan {fast.makespan_ticks:,} ticks" in bottom.get_title(loc="left")
    _check_bars_match_events(top, slow.figures, fig)
    _check_bars_match_events(bottom, fast.figures, fig)
    ratio = fast.makespan_ticks / slow.makespan_ticks
    assert any(f"without takes {ratio:.2f}x the time of with recompute" in t for t in _texts(fig))
    assert "recompute" in _legend_labels(fig) and "makespan" in _legend_labels(fig)


def test_memory_comparison(p3):
    a, b = synthetic_pipeline(), synthetic_pipeline(budget=3 * MiB)
    fig = plots.comparison_figure(a, b, ("GPipe", "1F1B"), what="memory")
    plot_axes = [ax for ax in fig.axes if ax.lines]
    assert len(plot_axes) == 4  # identical pairs per rank would merge; stages differ
    for ax in plot_axes:
        assert len([l for l in ax.lines if l.get_gid() == "memory"]) == 2
        assert len([l for l in ax.lines if l.get_gid() == "peak"]) == 2
    assert {"GPipe (MiB alive)", "1F1B (MiB alive)"} <= set(_legend_labels(fig))
    fig = plots.comparison_figure(p3, p3, ("a", "b"), what="memory")
    assert len([ax for ax in fig.axes if ax.lines]) == 1  # p3's ranks are identical in both
    with pytest.raises(ValueError):
        plots.comparison_figure(p3, p3, what="bogus")


# ---- the other inputs, and files


def test_figures_from_json_plot_the_same(p3):
    data = json.loads(json.dumps(p3.to_dict(figures=True)))  # peers become lists, tuples become lists
    fig = plots.schedule_figure(data)
    assert len(_bars(fig)) == len(_bars(plots.schedule_figure(p3)))
    assert any(t.startswith("p3 Data parallel (pass): schedule") for t in _texts(fig))
    assert plots.peak_table(data) == plots.peak_table(p3)


def test_results_without_figures_get_a_note_not_an_exception(tmp_path):
    broken = PuzzleResult("p3", "data_parallel", "Data parallel", ERROR, error="DeadlockError: every rank ...")
    for draw in (plots.memory_figure, plots.schedule_figure):
        fig = draw(broken)
        assert any("no " in t and "to plot" in t for t in _texts(fig))
    assert plots.write_plots(broken, tmp_path) == []
    assert plots.peak_table(broken) == "p3 Data parallel: no memory data"


def test_write_plots_writes_pngs(p3, tmp_path):
    paths = plots.write_plots(p3, tmp_path / "plots")
    assert [p.name for p in paths] == ["p3_memory.png", "p3_schedule.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plots_do_not_touch_pyplot():
    import sys

    plots.schedule_figure(synthetic_pipeline())
    pyplot = sys.modules.get("matplotlib.pyplot")
    assert pyplot is None or not pyplot.get_fignums()  # nothing registered, nothing to close


def test_figures_show_themselves_in_a_notebook():
    fig = plots.schedule_figure(synthetic_pipeline())
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
