"""The class summary: where a class struggles, per puzzle. Written by `batch` beside its CSV.

    summarize(scores)               per puzzle: how many submissions passed, failed, erred, did not attempt it, and
                                    the most common reasons for not passing, most frequent first
    summary_markdown(rows, ...)     RESULTS.summary.md: the table, then each puzzle's reasons with who had them
    summary_figure(rows)            RESULTS.summary.png: one bar per puzzle, its submissions by outcome

A reason groups the submissions that failed the same way, not the same numbers: a failed check is its name
("bubble failed"), with the likely causes the grader gave listed under it; an error is its kind (the exception's
name, "stopped at the time limit", "ran out of memory"), with its figures left out. Rows that
are no submission (a stray file) are not counted; a submission that could not be graded as a whole counts as an
error of every puzzle, with its own reason.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ...core.result import FAIL, NOT_ATTEMPTED, PASS
from .scoring import SubmissionScore, one_line

OUTCOMES = ("passed", "failed", "error", "not attempted")
COLOURS = {"passed": "#54A24B", "failed": "#E45756", "error": "#F58518", "not attempted": "#BAB0AC"}
TOP = 3  # reasons shown per puzzle in the table
_EXCEPTION = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt))\b")


@dataclass
class PuzzleSummary:
    id: str
    title: str
    counts: Counter = field(default_factory=Counter)  # outcome -> submissions
    reasons: Counter = field(default_factory=Counter)  # reason -> submissions
    who: dict[str, list[str]] = field(default_factory=dict)  # reason -> the submissions' names
    causes: dict[str, Counter] = field(default_factory=dict)  # reason -> the likely causes given, counted

    @property
    def graded(self) -> int:
        return sum(self.counts.values())


def outcome(status: str) -> str:
    return {PASS: "passed", FAIL: "failed", NOT_ATTEMPTED: "not attempted"}.get(status, "error")


def reason_kind(p) -> str:
    """What went wrong with one puzzle of one submission, as a kind shared by the submissions that went wrong
    the same way ("" when it passed)."""
    if p.status == PASS:
        return ""
    if p.status == NOT_ATTEMPTED:
        return "not attempted" if "not handed in" not in p.reason else "not handed in"
    failed = [c for c in (p.result.checks if p.result is not None else []) if not c.passed]
    if p.status == FAIL and failed:
        return f"{failed[0].name} failed"
    text = p.reason or (p.result.error if p.result is not None else "") or p.status
    if text.startswith("stopped after"):
        return "stopped at the time limit"
    if text.startswith("ran out of memory"):
        return "ran out of memory"
    if text.startswith("not graded: the submission's time limit"):
        return "the submission's time limit ran out first"
    found = _EXCEPTION.search(text)
    if found:
        return f"error: {found.group(1)}"
    return p.status.replace("_", " ") + ": " + re.sub(r"\d[\d,.]*", "N", one_line(text, 80))


def summarize(scores: list[SubmissionScore]) -> list[PuzzleSummary]:
    summaries: dict[str, PuzzleSummary] = {}
    for s in scores:
        if s.kind == "stray":
            continue
        for p in s.puzzles:
            ps = summaries.setdefault(p.id, PuzzleSummary(p.id, p.title))
            ps.counts[outcome(p.status)] += 1
            kind = reason_kind(p) if p.result is not None or not s.error else \
                "not graded: " + re.sub(r"\d[\d,.]*", "N", one_line(s.error, 80))
            if kind:
                ps.reasons[kind] += 1
                ps.who.setdefault(kind, []).append(s.name)
                failed = [c for c in (p.result.checks if p.result is not None else []) if not c.passed]
                if p.status == FAIL and failed and failed[0].diagnosis:
                    ps.causes.setdefault(kind, Counter())[one_line(failed[0].diagnosis, 160)] += 1
    return list(summaries.values())


def summary_markdown(summaries: list[PuzzleSummary], submissions: int, seed: int) -> str:
    out = [f"# Class summary: {submissions} submissions (seed {seed})", "",
           "Per puzzle, how many submissions passed, failed, raised an error or did not attempt it, and the most "
           "common reasons for not passing (how many had each). The plot beside this file draws the same counts.",
           "",
           "| puzzle | passed | failed | error | not attempted | most common reasons |",
           "| --- | ---: | ---: | ---: | ---: | --- |"]
    for ps in summaries:
        top = "; ".join(f"{reason} ({n})" for reason, n in ps.reasons.most_common(TOP)).replace("|", "\\|")
        out.append(f"| {ps.id} {ps.title} | {ps.counts['passed']} | {ps.counts['failed']} | {ps.counts['error']} | "
                   f"{ps.counts['not attempted']} | {top or '-'} |")
    out += ["", "## Every reason, with who had it", ""]
    for ps in summaries:
        if not ps.reasons:
            continue
        out += [f"### {ps.id} {ps.title}", ""]
        for reason, n in ps.reasons.most_common():
            names = ps.who[reason]
            shown = ", ".join(names[:8]) + (f", and {len(names) - 8} more" if len(names) > 8 else "")
            out.append(f"- {reason} ({n}): {shown}")
            out += [f"  - likely cause ({k}): {cause}" for cause, k in ps.causes.get(reason, Counter()).most_common()]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def summary_figure(summaries: list[PuzzleSummary]):
    """One horizontal bar per puzzle, its submissions split by outcome, the number in each part."""
    from ..plots.canvas import new_figure

    height = 1.2 + 0.42 * len(summaries)
    fig = new_figure(9.0, height)
    from matplotlib.ticker import MaxNLocator

    ax = fig.add_axes((0.36, 0.9 / height, 0.60, 1 - 1.6 / height))
    labels = [f"{ps.id} {ps.title}" if len(ps.title) <= 30 else f"{ps.id} {ps.title[:29]}…" for ps in summaries]
    left = [0] * len(summaries)
    for what in OUTCOMES:
        widths = [ps.counts[what] for ps in summaries]
        bars = ax.barh(range(len(summaries)), widths, left=left, color=COLOURS[what], label=what, height=0.7,
                       edgecolor="white", linewidth=0.8)
        for bar, n in zip(bars, widths):
            if n:
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2, str(n),
                        ha="center", va="center", fontsize=8, color="white" if what != "not attempted" else "#333")
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(summaries)), labels, fontsize=9)
    ax.invert_yaxis()  # p1 at the top
    ax.set_xlabel("submissions")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, max(left + [1]))
    ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Where the class stands, per puzzle", x=0.02, ha="left", y=1 - 0.18 / height, fontsize=11)
    fig.legend(loc="upper right", ncols=4, fontsize=8, frameon=False, bbox_to_anchor=(0.98, 1 - 0.12 / height))
    return fig


def similar_lines(similarity, similar_md: Path | None) -> list[str]:
    """The summary's pointer to the similar pairs (similarity.py), or how to ask for them."""
    if similarity is None:
        return ["", "Similar submissions were not compared (`batch --similarity` does)."]
    from .similarity import SEVERAL, pairs_across

    pairs = pairs_across(similarity)
    where = f" ({similar_md.name} has them, and each puzzle's)" if similar_md else ""
    lines = ["", "## Similar submissions", "",
             f"{len(pairs)} pairs of submissions have the same code on {SEVERAL} puzzles or more{where}: for a person "
             f"to read, no points depend on it."]
    lines += [f"- {s.a} and {s.b}: {len(s.same)} of {s.compared} puzzles ({', '.join(s.same)})" for s in pairs[:10]]
    return lines + ([f"- and {len(pairs) - 10} more"] if len(pairs) > 10 else [])


def write_summary(scores: list[SubmissionScore], csv_path: Path, seed: int, similarity=None,
                  similar_md: Path | None = None) -> list[Path]:
    """RESULTS.summary.md and RESULTS.summary.png beside the CSV at `csv_path`."""
    from ..plots.canvas import save

    summaries = summarize(scores)
    base = Path(csv_path).with_suffix("")
    md, png = Path(f"{base}.summary.md"), Path(f"{base}.summary.png")
    submissions = sum(s.kind != "stray" for s in scores)
    text = summary_markdown(summaries, submissions, seed) + "\n".join(similar_lines(similarity, similar_md)) + "\n"
    md.write_text(text)
    save(summary_figure(summaries), png)
    return [md, png]
