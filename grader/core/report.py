"""Renderings of PuzzleResults: the console table, JSON, HTML for the notebook, the pytest failure message."""

from __future__ import annotations

import html
import json

from .result import ERROR, FAIL, GRADER_ERROR, NOT_ATTEMPTED, PARTIAL, PASS, TAMPERED, PuzzleResult, fmt

BADGES = {PASS: "PASS", FAIL: "FAIL", PARTIAL: "PARTIAL", ERROR: "ERROR", TAMPERED: "TAMPERED",
          GRADER_ERROR: "GRADER ERROR", NOT_ATTEMPTED: "not attempted"}
COLOURS = {PASS: "#1a7f37", FAIL: "#cf222e", PARTIAL: "#9a6700", ERROR: "#cf222e", TAMPERED: "#8250df",
           GRADER_ERROR: "#6e7781", NOT_ATTEMPTED: "#6e7781"}


def summary_line(r: PuzzleResult, width: int = 28) -> str:
    """One puzzle's row of the console table; `width` is the title column's (the longest title of the table)."""
    made = [c for c in r.checks if not c.simulator_only]
    n_ok = sum(c.passed for c in made)
    detail = f"{n_ok}/{len(made)} checks" if r.checks else ""
    if len(made) < len(r.checks):
        detail += f" (+{len(r.checks) - len(made)} simulator only)"
    return f"{r.id:<4} {r.title:<{width}} {BADGES.get(r.status, r.status):<14} {detail}".rstrip()


def detail_lines(r: PuzzleResult, verbose: bool = False) -> list[str]:
    """The lines under a puzzle's summary: each failing check (every check if verbose), or the error."""
    lines = []
    if r.status not in (PASS, FAIL) and r.error:
        if r.status != NOT_ATTEMPTED:
            lines += [f"  {line}" for line in r.error.splitlines()]
        return lines
    for c in r.checks:
        if c.passed and not verbose and not c.simulator_only:
            continue
        mark = "sim " if c.simulator_only else "ok  " if c.passed else "FAIL"
        lines.append(f"  {mark} {c.name}: {c.message}")
        if c.diagnosis:
            lines.append(f"       likely cause: {c.diagnosis}")
    return lines


def console(results: list[PuzzleResult], target: str, seed: int, verbose: bool = False, backend: str = "") -> str:
    on = f" on {backend}" if backend else ""
    out = [f"Grading {target}{on} (seed {seed}; reproduce with --seed {seed})", ""]
    width = max([28] + [len(r.title) for r in results])
    for r in results:
        out.append(summary_line(r, width))
        out += detail_lines(r, verbose)
    out += ["", counts_line(results)]
    if all(r.status == NOT_ATTEMPTED for r in results):
        out.append(how_to_start(target))
    return "\n".join(out)


def how_to_start(target: str) -> str:
    """What to do first, said for where the learner works: a notebook, or the puzzle files."""
    if str(target).endswith(".ipynb"):
        name = str(target).replace("\\", "/").rsplit("/", 1)[-1]
        return (f"To start: open {name}, read a puzzle's story, write your answer in the code cell under it (replace "
                f"its `raise NotImplementedError`), run that cell, then its check cell (or run this again).")
    return ("To start: read the story at the top of a puzzle file (puzzles/p1_checkpointing.py, ...), replace its "
            "`raise NotImplementedError` with your code, and run this again (or open puzzles.ipynb).")


def stated_budget(check) -> str:
    """The check's budget as a line of its own, or "" when there is none or the message already states it (most
    messages say "within the budget FORMULA = VALUE": printed again beneath, each budget read twice)."""
    if check.budget is None or check.budget.formula in check.message:
        return ""
    return check.budget.describe()


def counts_line(results: list[PuzzleResult]) -> str:
    """'3 passed, 1 failed, 0 errors, 4 not attempted', plus the rarer statuses when there are any."""
    counts = {s: sum(r.status == s for r in results) for s in BADGES}
    line = (f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[ERROR]} errors, "
            f"{counts[NOT_ATTEMPTED]} not attempted")
    for status, words in ((PARTIAL, "partial"), (TAMPERED, "tampered"), (GRADER_ERROR, "grader errors")):
        if counts[status]:
            line += f", {counts[status]} {words}"
    return line


def to_json(results: list[PuzzleResult], target: str, seed: int, figures: bool = False) -> str:
    return json.dumps({"target": target, "seed": seed, "puzzles": [r.to_dict(figures) for r in results]})


def pytest_message(r: PuzzleResult, seed: int) -> str:
    head = f"{r.id} {r.title}: {BADGES.get(r.status, r.status)} (seed {seed}; reproduce with --seed {seed})"
    return "\n".join([head] + detail_lines(r, verbose=True))


_CELL = "text-align:left;vertical-align:top"  # Jupyter's stylesheet right-aligns table cells


def to_html(r: PuzzleResult, seed: int) -> str:
    """A compact card for the notebook's check cell: a status banner, the checks, the budgets."""
    colour = COLOURS.get(r.status, "#6e7781")
    rows = []
    for c in r.checks:
        mark = "&#9675;" if c.simulator_only else "&#10004;" if c.passed else "&#10008;"
        budget = f"<br><small>budget: {html.escape(stated_budget(c))}</small>" if stated_budget(c) else ""
        diag = (f"<br><b>likely cause:</b> {html.escape(c.diagnosis)}" if c.diagnosis else "")
        rows.append(f"<tr><td style='color:{'#1a7f37' if c.passed else '#cf222e'};{_CELL}'>{mark}</td>"
                    f"<td style='{_CELL}'><b>{html.escape(c.name)}</b></td>"
                    f"<td style='{_CELL}'>{html.escape(c.message)}{budget}{diag}</td></tr>")
    body = "".join(rows)
    if r.error and r.status != PASS:
        body += f"<tr><td></td><td colspan=2 style='{_CELL}'><pre>{html.escape(r.error)}</pre></td></tr>"
    peaks = ", ".join(fmt(p, "bytes") for p in r.peak_bytes)
    foot = (f"<small>peak memory per rank: {html.escape(peaks)}; makespan {fmt(r.makespan_ticks, 'ticks')}; "
            f"seed {seed}</small>") if r.peak_bytes else f"<small>seed {seed}</small>"
    return (f"<div style='border:1px solid {colour};border-radius:6px;padding:8px;margin:4px 0'>"
            f"<div style='color:{colour};font-weight:bold'>{html.escape(r.id)} {html.escape(r.title)}: "
            f"{BADGES.get(r.status, r.status)}</div><table>{body}</table>{foot}</div>")
