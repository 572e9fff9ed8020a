"""What a mutation run says: a table per puzzle, the survivors with their diffs, the equivalents with their
reasons, totals, `--json`, and the exit status.

The word "survived" is printed only when a mutant survived (the project's hook looks for it), so the summary
columns say "not killed".
"""

from __future__ import annotations

import json

from ...core.result import fmt
from .outcome import EQUIVALENT, GRADER_ERROR, KILLED, SURVIVED, TOOL_ERROR, Outcome
from .session import PuzzleRun

STATUS_LABEL = {KILLED: "killed", SURVIVED: "SURVIVED", EQUIVALENT: "equivalent", GRADER_ERROR: "GRADER ERROR",
                TOOL_ERROR: "TOOL ERROR"}


def exit_status(runs: list[PuzzleRun]) -> int:
    """0: every mutant that is not equivalent was killed. 1: one survived, or crashed the grader's checks (a
    wrong answer the grader lets through, or cannot judge). 2: the run itself is in doubt (a reference that does
    not pass, a missing file, a tool error)."""
    if any(r.error for r in runs) or any(o.status == TOOL_ERROR for r in runs for o in r.outcomes):
        return 2
    return 1 if any(o.status in (SURVIVED, GRADER_ERROR) for r in runs for o in r.outcomes) else 0


def cost_difference(run: PuzzleRun, o: Outcome) -> str:
    """How the mutant's memory and time differ from the reference's (the evidence for or against equivalence)."""
    if not o.peak_bytes:
        return ""
    deltas = [m - r for m, r in zip(o.peak_bytes, run.reference_peak)]
    ticks = (o.makespan or 0) - run.reference_makespan
    if not any(deltas) and not ticks:
        return "same peak memory on every rank and same makespan as the reference"
    worst = max(range(len(deltas)), key=lambda i: abs(deltas[i]))
    peak = (f"peak {'+' if deltas[worst] > 0 else '-'}{fmt(abs(deltas[worst]), 'bytes')} on rank {worst}"
            if deltas[worst] else "same peak memory")
    time = f"makespan {'+' if ticks > 0 else '-'}{fmt(abs(ticks), 'ticks')}" if ticks else "same makespan"
    return f"{peak}, {time} (against the reference)"


def _rate(rate) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _row(o: Outcome) -> str:
    m = o.mutant
    what = o.killed_by if o.status == KILLED else "(below)"
    return f"  {STATUS_LABEL[o.status]:<12} {m.operator:<18} {m.lineno:>4}  {m.description[:58]:<58}  {what}"


def _indent(text: str, by: str = "      ") -> str:
    return "\n".join(by + line for line in text.rstrip().splitlines())


def console(runs: list[PuzzleRun], target: str, seed: int, verbose: bool = True) -> str:
    out = [f"Mutation testing of the grader on {target} (seed {seed}): each mutant is a reference solution with "
           f"one learner's mistake in it, graded like an answer."]
    for run in runs:
        out.append("")
        if run.error:
            out.append(f"{run.id}  {run.title}: not tested: {run.error}")
            continue
        out.append(f"{run.id}  {run.title}  ({len(run.outcomes)} mutants in {run.seconds:.1f} s; the reference ran "
                   f"in {run.reference_seconds:.2f} s, so the simulator's time limit is {run.limits.sim_timeout:g} s)")
        if verbose:
            out.append(f"  {'result':<12} {'operator':<18} {'line':>4}  {'the mistake':<58}  killed by")
            out += [_row(o) for o in run.outcomes]
        for o in run.outcomes:
            m = o.mutant
            where = f"{run.id} {m.operator}, line {m.lineno}: {m.description}"
            if o.status == EQUIVALENT:
                out.append(f"  equivalent: {where}\n      {o.detail}\n      measured: {cost_difference(run, o)}")
            elif o.status == SURVIVED:
                out.append(f"  SURVIVED: {where}\n      a wrong answer the grader passes ({cost_difference(run, o)}); "
                           f"if it is no wrong answer, add it to the equivalents with a reason:\n"
                           f"      {json.dumps({**m.key, 'reason': '...'})}\n{_indent(m.diff)}")
            elif o.status in (GRADER_ERROR, TOOL_ERROR):
                who = "the grader's checks crashed on" if o.status == GRADER_ERROR else "this tool failed on"
                out.append(f"  {STATUS_LABEL[o.status]}: {where}\n      {who} this mutant:\n{_indent(o.detail)}\n"
                           f"{_indent(m.diff)}")
            if o.listed_equivalent:
                out.append(f"  note: {where} is on the equivalents list ({o.listed_equivalent}) but was killed by "
                           f"{o.killed_by}: the grader rejects an answer the list calls correct, or the entry is wrong")
        for e in run.stale:
            out.append(f"  note: the equivalents entry {e.operator} {e.line!r} -> {e.mutant!r} matches no mutant "
                       f"of {run.id} any more: remove or update it")
    out.append("")
    out.append(summary_table(runs))
    out.append(verdict(runs))
    return "\n".join(out)


def totals(runs: list[PuzzleRun]) -> dict:
    outcomes = [o for r in runs for o in r.outcomes]
    counts = {s: sum(1 for o in outcomes if o.status == s) for s in STATUS_LABEL}
    scored = len(outcomes) - counts[EQUIVALENT]
    return {"mutants": len(outcomes), **counts, "kill_rate": counts[KILLED] / scored if scored else None,
            "seconds": round(sum(r.seconds for r in runs), 2),
            "cpu_seconds": round(sum(r.cpu_seconds for r in runs), 2)}


def summary_table(runs: list[PuzzleRun]) -> str:
    rows = [f"{'puzzle':<8}{'mutants':>8}{'killed':>8}{'equivalent':>12}{'not killed':>12}{'kill rate':>11}"
            f"{'wall':>9}{'cpu':>9}"]
    for r in runs:
        not_killed = len(r.outcomes) - r.count(KILLED) - r.count(EQUIVALENT)
        rows.append(f"{r.id:<8}{len(r.outcomes):>8}{r.count(KILLED):>8}{r.count(EQUIVALENT):>12}{not_killed:>12}"
                    f"{_rate(r.kill_rate):>11}{r.seconds:>8.1f}s{r.cpu_seconds:>8.1f}s"
                    + ("  (not tested)" if r.error else ""))
    t = totals(runs)
    not_killed = t["mutants"] - t[KILLED] - t[EQUIVALENT]
    rows.append(f"{'total':<8}{t['mutants']:>8}{t[KILLED]:>8}{t[EQUIVALENT]:>12}{not_killed:>12}"
                f"{_rate(t['kill_rate']):>11}{t['seconds']:>8.1f}s{t['cpu_seconds']:>8.1f}s")
    return "\n".join(rows)


def verdict(runs: list[PuzzleRun]) -> str:
    t = totals(runs)
    parts = []
    if t[SURVIVED]:
        parts.append(f"{t[SURVIVED]} mutant(s) survived: wrong answers the grader passes")
    if t[GRADER_ERROR]:
        parts.append(f"{t[GRADER_ERROR]} mutant(s) crashed the grader's checks")
    if t[TOOL_ERROR]:
        parts.append(f"{t[TOOL_ERROR]} mutant(s) could not be graded (tool errors)")
    if any(r.error for r in runs):
        parts.append("some puzzles were not tested")
    if not parts:
        return "Every mutant that is not equivalent was killed. (exit status 0)"
    return "; ".join(parts) + f". (exit status {exit_status(runs)})"


def to_json(runs: list[PuzzleRun], target: str, seed: int) -> str:
    puzzles = []
    for r in runs:
        d = {"id": r.id, "title": r.title, "file": r.file, "seconds": round(r.seconds, 2)}
        if r.error:
            d["error"] = r.error
        else:
            d.update({"reference_seconds": round(r.reference_seconds, 3), "sim_timeout": r.limits.sim_timeout,
                      "reference_peak_bytes": r.reference_peak, "reference_makespan_ticks": r.reference_makespan,
                      **totals([r]), "outcomes": [o.to_dict() for o in r.outcomes],
                      "stale_equivalents": [e.__dict__ for e in r.stale]})
        puzzles.append(d)
    return json.dumps({"target": target, "seed": seed, "puzzles": puzzles, "totals": totals(runs),
                       "exit_status": exit_status(runs)}, indent=1)
