"""The reports of `python -m grader batch`: what an instructor opens after grading a class.

    write_csv(scores, path)            one row per submission: total points, then per puzzle its points, status and
                                       the one-line reason it did not pass; opens in any spreadsheet
    write_json(scores, path, ...)      everything: the weights as resolved, each puzzle's result with every check
                                       and its points (the plots' raw data is left out: 0.3 MB a submission)
    write_feedback(scores, dir, ...)   one folder per submission with feedback.md (each puzzle's checks, what is
                                       wrong, the likely cause) and the memory and schedule plots beside it
    write_gradescope(scores, dir, ...) Gradescope's results.json for each submission (gradescope.py)
    write_reports(rows, ...)           all of the above that were asked for, from `batch.run_batch`'s rows

Each takes the rows already scored (scoring.py), so every report shows the same points. A row that is not a
submission (a stray file) or could not be read (a broken notebook) is a row like the others, with its kind and its
reason; nothing is skipped.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

from ...core.result import PASS
from ...specs import SPECS
from .scoring import SubmissionScore, Weights, budget_line, headline, number, one_line, points_text, score_row

STATUS_WORD = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "not_attempted": "not attempted",
               "not_graded": "not graded"}


def stray_rows(folder: Path, rows: list[dict]) -> list[dict]:
    """The rows, plus one for each visible entry of `folder` that has none (a stray file that `batch` did not
    take as a submission), in the folder's order: nothing in the folder goes unmentioned."""
    by_name = {r["name"]: r for r in rows}
    covered = {item: r["name"] for r in rows for item in r.get("items", [])}  # an LMS export's files: one row
    out = []
    for item in sorted(folder.iterdir()):
        if covered.get(item.name) in by_name:
            out.append(by_name.pop(covered[item.name]))
        elif item.name in by_name:
            out.append(by_name.pop(item.name))
        elif not item.name.startswith(".") and item.name not in covered:
            out.append({"name": item.name, "kind": "stray", "flags": [], "seconds": 0.0, "puzzles": [],
                        "error": f"not graded: {item.name} is not a submission (a notebook *.ipynb, or a folder "
                                 f"laid out like puzzles/)"})
    return out + list(by_name.values())


# ---- CSV


def csv_header(puzzle_ids: list[str]) -> list[str]:
    per_puzzle = [col for pid in puzzle_ids for col in (pid, f"{pid} points", f"{pid} reason")]
    return ["submission", "kind", "graded", "points", "max points", "passed", *per_puzzle, "error", "flags",
            "similar", "seconds"]


def text_cell(text: str) -> str:
    """A cell a spreadsheet shows as text: one that starts like a formula ("=", "+", "-", "@": a learner's folder
    name or exception message) gets a leading apostrophe, so that opening the CSV runs nothing."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_row(s: SubmissionScore, similar: str = "") -> list:
    per_puzzle = [cell for p in s.puzzles for cell in (p.status, points_text(p.points), text_cell(p.reason))]
    passed = sum(p.status == PASS for p in s.puzzles)
    flags = "; ".join(one_line(f) for f in s.flags)
    return [text_cell(s.name), s.kind, text_cell(s.graded), points_text(s.points), points_text(s.max_points), passed,
            *per_puzzle, text_cell(one_line(s.error)), text_cell(flags), text_cell(similar), s.seconds]


def write_csv(scores: list[SubmissionScore], path: Path, puzzle_ids: list[str], similar=None) -> None:
    """`similar`: each row's similar pairs (compare_submissions), for the instructor's eyes only: the CSV and the
    summary have them, the feedback and Gradescope's pages never (they would name another learner)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    similar = similar or [""] * len(scores)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(csv_header(puzzle_ids))
        w.writerows(csv_row(s, cell) for s, cell in zip(scores, similar))


# ---- JSON


def maybe(points):
    return None if points is None else number(points)


def submission_dict(s: SubmissionScore) -> dict:
    puzzles = []
    for p in s.puzzles:
        d = p.result.to_dict() if p.result is not None else {"id": p.id, "title": p.title, "status": p.status,
                                                                 "checks": []}
        d.update(points=number(p.points), max_points=number(p.max_points), reason=p.reason)
        for check, score in zip(d["checks"], p.checks):
            check.update(points=maybe(score.points), max_points=maybe(score.max_points))
        d["checks"] += [{"name": c.name, "passed": False, "message": "no such check in this result",
                         "points": maybe(c.points), "max_points": maybe(c.max_points)}
                        for c in p.checks[len(d["checks"]):]]
        puzzles.append(d)
    return {"name": s.name, "kind": s.kind, "graded": s.graded, "note": s.note, "points": number(s.points),
            "max_points": number(s.max_points), "error": s.error,
            "flags": s.flags, "seconds": s.seconds, "puzzles": puzzles}


def write_json(scores: list[SubmissionScore], path: Path, seed: int, weights: Weights, puzzle_ids: list[str]) -> None:
    data = {"seed": seed, "weights": weights.describe(puzzle_ids),
            "submissions": [submission_dict(s) for s in scores]}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1))


# ---- per-student feedback


def safe_name(name: str) -> str:
    """A submission's name as a folder name: letters, digits, '.', '_' and '-' only, never hidden."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".") or "submission"
    return cleaned[:120]


def unique_folders(scores: list[SubmissionScore]) -> list[str]:
    """One distinct safe name per submission ('a b' and 'a_b' would collide: the second becomes 'a_b-2')."""
    seen: dict[str, int] = {}
    out = []
    for s in scores:
        base = safe_name(s.name)
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return out


def fenced(text: str) -> list[str]:
    fence = "~~~~" if "```" in text else "```"
    return [fence + "text", text.rstrip(), fence]


def feedback_markdown(s: SubmissionScore, seed: int, plots: dict[str, list[str]]) -> str:
    """The feedback file of one submission; `plots` maps a puzzle id to the image files drawn for it."""
    out = [f"# Feedback: {s.name}", "", headline(s, seed), ""] + ([s.note, ""] if s.note else [])
    if s.error:
        out += ["This submission could not be graded as a whole:", "", *fenced(s.error), ""]
    if s.flags:
        out += ["Flagged for your instructor to review:", "", *(f"- {one_line(f)}" for f in s.flags), ""]
    if s.error and all(p.result is None for p in s.puzzles):  # nothing was graded: say so once, not per puzzle
        return "\n".join(out + ["No puzzle was graded."]) + "\n"
    out += ["| puzzle | status | points |", "| --- | --- | --- |"]
    out += [(f"| {p.id} {p.title} | {STATUS_WORD.get(p.status, p.status)} | {points_text(p.points)} / "
             f"{points_text(p.max_points)} |") for p in s.puzzles]
    for p in s.puzzles:
        heading = (f"## {p.id} {p.title}: {STATUS_WORD.get(p.status, p.status)} "
                   f"({points_text(p.points)} of {points_text(p.max_points)} points)")
        out += ["", heading, ""]
        out += puzzle_lines(p)
        out += [f"![{Path(f).stem.replace('_', ' ')}]({f})" for f in plots.get(p.id, [])]
    return "\n".join(out) + "\n"


def puzzle_lines(p) -> list[str]:
    if p.result is None:
        return [f"Not graded: {p.reason or 'the submission could not be graded as a whole (above)'}.", ""]
    r = p.result
    if not r.checks:
        word = "Not attempted" if r.status == "not_attempted" else "What happened"
        return [f"{word}:", "", *fenced(r.error or r.status), ""]
    lines = []
    for c, score in zip(r.checks, p.checks):
        points = f" ({points_text(score.points)} / {points_text(score.max_points)} points)" \
            if score.points is not None else ""
        lines.append(f"- **{'ok' if c.passed else 'FAIL'} {c.name}**{points}: {c.message}")
        if budget_line(c):
            lines.append(f"  - {budget_line(c)}")
        if c.diagnosis:
            lines.append(f"  - likely cause: {c.diagnosis}")
    lines += [f"- **FAIL {c.name}**: this check is missing from the result" for c in p.checks[len(r.checks):]]
    if r.error:
        lines += ["", *fenced(r.error)]
    return lines + [""]


def write_feedback(scores: list[SubmissionScore], directory: Path, seed: int, plots: bool = True) -> list[Path]:
    """DIR/<submission>/feedback.md, with each graded puzzle's memory and schedule plots beside it."""
    from .. import plots as plotting  # matplotlib: only when feedback is asked for

    written = []
    for s, folder_name in zip(scores, unique_folders(scores)):
        folder = Path(directory) / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        drawn = {}
        for p in s.puzzles:
            if plots and p.result is not None and p.result.figures:
                drawn[p.id] = [f.name for f in plotting.write_plots(p.result, folder)]
        path = folder / "feedback.md"
        path.write_text(feedback_markdown(s, seed, drawn))
        written.append(path)
    return written


# ---- all of them


def write_gradescope(scores: list[SubmissionScore], directory: Path, seed: int, weights: Weights | None = None,
                     **visibility) -> list[Path]:
    """DIR/<submission>.json: what Gradescope would show each learner (gradescope.py holds the format)."""
    from .gradescope import results_json

    Path(directory).mkdir(parents=True, exist_ok=True)
    written = []
    for s, name in zip(scores, unique_folders(scores)):
        path = Path(directory) / f"{name}.json"
        path.write_text(json.dumps(results_json(s, seed, note=s.note, weights=weights, **visibility), indent=1))
        written.append(path)
    return written


def compare_submissions(folder: Path, rows: list[dict], puzzle_ids=None):
    """The class's similar pairs (similarity.py), from the code each submission in `folder` holds (read as data,
    never imported); each row gets its `similar` cell. Raises SimilarityUnavailable without copydetect."""
    from ..batch.submissions import submissions_in
    from ..handed_in import attempted_code
    from .similarity import compare_class, similar_to

    ids = list(puzzle_ids or SPECS)
    sources = {sub.name: {p: code for p, code in attempted_code(sub.files, sub.notebook).items() if p in ids}
               for sub in submissions_in(Path(folder)) if not sub.error}
    found = compare_class(sources, {p: stub for p, stub in stub_texts().items() if p in ids})
    cells = similar_to(found)
    for row in rows:
        row["similar"] = cells.get(row["name"], "")
    return found


def stub_texts() -> dict[str, str]:
    """{puzzle id: the stub a learner starts from}: made from solutions/ in a checkout, else the package's own."""
    from ..build import planned_files
    from ..targets import REPO, in_checkout

    if in_checkout():
        return {spec.id: planned_files(REPO)[REPO / "puzzles" / spec.filename] for spec in SPECS.values()}
    return {spec.id: (REPO / "puzzles" / spec.filename).read_text() for spec in SPECS.values()
            if (REPO / "puzzles" / spec.filename).is_file()}


def write_reports(rows: list[dict], seed: int, puzzle_ids=None, weights: Weights | None = None, csv_path=None,
                  json_path=None, feedback_dir=None, gradescope_dir=None, plots: bool = True,
                  log=sys.stderr, similarity=None) -> list[Path]:
    """Score the rows once, then write each report asked for; returns what was written. The CSV comes with its
    class summary (summary.py) and, given `similarity` (compare_submissions), the similar pairs. A check named in
    the weights that no result has is reported to `log` (a typo there would cost every learner that check)."""
    from .similarity import similarity_markdown
    from .summary import write_summary

    ids = list(puzzle_ids or SPECS)
    weights = weights or Weights()
    scores = [score_row(r, weights, ids) for r in rows]
    for problem in unknown_check_names(scores, weights):
        print(f"warning: weights: {problem}", file=log)
    written = []
    if csv_path:
        write_csv(scores, Path(csv_path), ids, [r.get("similar", "") for r in rows])
        written.append(Path(csv_path))
        similar_md = None
        if similarity is not None:
            similar_md = Path(f"{Path(csv_path).with_suffix('')}.similarity.md")
            similar_md.write_text(similarity_markdown(similarity))
        written += write_summary(scores, Path(csv_path), seed, similarity, similar_md)
        written += [similar_md] if similar_md else []
    if json_path:
        write_json(scores, Path(json_path), seed, weights, ids)
        written.append(Path(json_path))
    if feedback_dir:
        written += write_feedback(scores, Path(feedback_dir), seed, plots)
    if gradescope_dir:
        written += write_gradescope(scores, Path(gradescope_dir), seed, weights)
    return written


def unknown_check_names(scores: list[SubmissionScore], weights: Weights) -> list[str]:
    """Check names in the weights that no graded result has (a typo gives every learner 0 for that check)."""
    seen: dict[str, set[str]] = {}
    for s in scores:
        for p in s.puzzles:
            if p.result is not None:
                seen.setdefault(p.id, set()).update(c.name for c in p.result.checks)
    return [f"{pid}: no check named {name!r} (its checks: {', '.join(sorted(seen[pid]))})"
            for pid, named in weights.check_weight.items() if pid in seen
            for name in named if name not in seen[pid]]
