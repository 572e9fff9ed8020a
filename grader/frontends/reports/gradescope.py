"""Gradescope: its results.json format, and the grading that runs inside its container for each submission.

    results_json(score, seed)   one submission's points in Gradescope's format: one test per puzzle (score,
                                max_score, status, output: each check, what is wrong, the likely cause)
    autograde()                 what the bundle's run_autograder calls: grade AUTOGRADER_ROOT/submission through
                                `batch`, which finds the work in it as it does in a class's folder (puzzle files, a
                                repository holding puzzles/, a notebook: ../handed_in.py), the learner's code in its
                                own process with its limits, and write
                                AUTOGRADER_ROOT/results/results.json, whatever happens

The format (Gradescope's "Autograder Specifications"): top level `score`, `execution_time`, `output`,
`visibility`, `stdout_visibility`, `extra_data`, `tests` and, when the weights ask for one, `leaderboard` (each
entry `name`, `value`, `order`); each test `name`, `score`, `max_score`, `status` ("passed" or "failed"),
`output`, `visibility`: the weights file's for the puzzle, or for a check that is a test of its own, else the
bundle's. Visibility is one of VISIBILITY. Gradescope shows the learner the
`output` fields and, with stdout_visibility "visible", the autograder's stdout (hidden by default: it is the
instructor's log). `gradescope_bundle.py` writes the bundle (`python -m grader gradescope OUT`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from decimal import Decimal
from pathlib import Path

from ...core.grading import fresh_seed
from ...core.result import FAIL, PASS
from ...specs import SPECS
from .scoring import (VISIBILITY, PuzzleScore, SubmissionScore, Weights, budget_line, headline, number, one_line,
                      parse_weights, points_text, score_row)
from ..handed_in import walk

CONFIG = "autograder.json"  # the bundle's settings, written by gradescope_bundle.py
WHOLE = "Not graded: your submission could not be graded as a whole (see the top of this page)."


def check_lines(c, score) -> list[str]:
    share = f" ({points_text(score.points)}/{points_text(score.max_points)})" if score.points is not None else ""
    lines = [f"{'ok  ' if c.passed else 'FAIL'} {c.name}{share}: {c.message}"]
    if budget_line(c):
        lines.append(f"     {budget_line(c)}")
    if c.diagnosis:
        lines.append(f"     likely cause: {c.diagnosis}")
    return lines


def test_output(p: PuzzleScore, apart: set[str] = frozenset(), points=None) -> str:
    """A puzzle's part of the page the learner reads: each check with its message, budget and likely cause; the
    checks in `apart` are tests of their own (check_visibility) and only counted here."""
    points, top = points if points is not None else (p.points, p.max_points)
    lines = [f"{p.status.replace('_', ' ').upper()}: {points_text(points)} of {points_text(top)} points"]
    r = p.result
    if r is None or not r.checks:
        detail = (r.error if r is not None else "") or p.reason or WHOLE
        return "\n".join(lines + ([""] + detail.rstrip().splitlines() if detail else []))
    for c, score in zip(r.checks, p.checks):
        if c.name not in apart:
            lines += check_lines(c, score)
    lines += [f"FAIL {c.name}: this check is missing from the result" for c in p.checks[len(r.checks):]
              if c.name not in apart]
    if apart:
        lines.append(f"(and {len(apart)} more: {', '.join(sorted(apart))}, each a test of its own)")
    return "\n".join(lines)


def puzzle_tests(p: PuzzleScore, weights: Weights, visibility: str) -> list[dict]:
    """The puzzle's test, and one test for each of its checks that the weights give a visibility of its own
    (partial credit: each check's points go with it)."""
    own = weights.check_visibility.get(p.id, {})
    scored = {c.name: c for c in p.checks}
    apart = [name for name in own if name in scored]
    points = p.points - sum((scored[n].points or 0 for n in apart), Decimal(0))
    top = p.max_points - sum((scored[n].max_points or 0 for n in apart), Decimal(0))
    tests = [{"name": f"{p.id} {p.title}", "score": number(points), "max_score": number(top),
              "status": "passed" if p.status == PASS else "failed",
              "output": test_output(p, set(apart), (points, top)),
              "visibility": weights.puzzle_visibility.get(p.id, visibility)}]
    results = {c.name: c for c in (p.result.checks if p.result is not None else [])}
    for name in apart:
        score, check = scored[name], results.get(name)
        output = check_lines(check, score) if check is not None else [f"FAIL {name}: this check is missing"]
        tests.append({"name": f"{p.id} {p.title}: {name}", "score": number(score.points or Decimal(0)),
                      "max_score": number(score.max_points or Decimal(0)),
                      "status": "passed" if score.passed and p.status in (PASS, FAIL) else "failed",
                      "output": "\n".join(output), "visibility": own[name]})
    return tests


def leaderboard(s: SubmissionScore, weights: Weights) -> list[dict]:
    """Gradescope's leaderboard entries the weights ask for: a figure of each puzzle that passed (a failed
    answer's makespan or memory says nothing worth ranking), lower is better."""
    entries = []
    for pid, metric in weights.leaderboard:
        p = next((p for p in s.puzzles if p.id == pid), None)
        if p is None or p.status != PASS or p.result is None:
            continue
        value = p.result.makespan_ticks if metric == "makespan" else max(p.result.peak_bytes or [0])
        entries.append({"name": f"{pid} {metric}", "value": value, "order": "asc"})
    return entries


def results_json(s: SubmissionScore, seed: int, visibility: str = "visible", stdout_visibility: str = "hidden",
                 note: str = "", weights: Weights | None = None) -> dict:
    """One submission's results.json (a dict; json.dumps it). The weights' visibility, where they set one, wins
    over `visibility`."""
    weights = weights or Weights()
    for v in (visibility, stdout_visibility):
        if v not in VISIBILITY:
            raise ValueError(f"visibility {v!r}: expected one of {', '.join(VISIBILITY)}")
    visibility = weights.visibility or visibility
    tests = [test for p in s.puzzles for test in puzzle_tests(p, weights, visibility)]
    head = [headline(s, seed)]
    if note:
        head.append(note)
    if s.error:
        head.append(f"Your submission could not be graded as a whole: {s.error.strip()}")
    if s.flags:
        head.append("Flagged for your instructor to review: " + "; ".join(one_line(f) for f in s.flags))
    data = {"score": number(s.points), "execution_time": round(s.seconds),
            "output": "\n\n".join(head), "visibility": visibility, "stdout_visibility": stdout_visibility,
            "extra_data": {"seed": seed, "kind": s.kind, "flags": s.flags}, "tests": tests}
    if weights.leaderboard:
        data["leaderboard"] = leaderboard(s, weights)
    return data


# ---- inside Gradescope's container

def _write(path: Path, data: dict) -> None:
    """Whole or not at all: written beside, then renamed over (Gradescope may stop the autograder at any moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data, indent=1))
    os.replace(part, path)


UNFINISHED = ("the autograder was stopped before it finished grading (out of time? Gradescope stops it at the "
              "assignment's time limit); your instructor has its log")


def autograde(environ=os.environ) -> int:
    """Grade one submission in Gradescope's layout and write its results.json; a results.json is written even
    when grading fails (then every puzzle scores 0, and the traceback goes to stdout, the instructor's log), and
    one that says grading did not finish is in place from the start, should the autograder be stopped."""
    root = Path(environ.get("AUTOGRADER_ROOT", "/autograder"))
    source = Path(environ.get("AUTOGRADER_SOURCE", root / "source"))
    results = root / "results" / "results.json"
    started = time.monotonic()
    seed = fresh_seed()
    config = {}
    try:
        _write(results, results_json(score_row({"name": "submission", "error": UNFINISHED, "puzzles": [],
                                                "seconds": 0.0}, parse_weights({}), list(SPECS)), seed))
    except Exception:  # (the final write below says the same, or better)
        traceback.print_exc(file=sys.stdout)
    try:
        print(f"grader from {Path(__file__).resolve().parent.parent}; seed {seed}", flush=True)
        config = json.loads((source / CONFIG).read_text())
        ids = config.get("puzzles") or list(SPECS)
        weights = parse_weights(config.get("weights") or {}, f"{CONFIG}: weights")
        visibility = {k: config.get(k, d) for k, d in (("visibility", "visible"), ("stdout_visibility", "hidden"))}
        row = _grade(root / "submission", seed, config, ids)
        row["seconds"] = time.monotonic() - started
        _write(results, results_json(score_row(row, weights, ids), seed, note=row.get("note", ""), weights=weights,
                                     **visibility))
        print(f"wrote {results}", flush=True)
    except Exception:
        traceback.print_exc(file=sys.stdout)
        ids = config.get("puzzles") or list(SPECS)
        row = {"name": "submission", "error": "the autograder failed (not your code's fault, as far as it can "
                                              "tell); your instructor has its log", "puzzles": [],
               "seconds": time.monotonic() - started}
        _write(results, results_json(score_row(row, parse_weights({}), ids), seed))
    return 0


def _grade(upload: Path, seed: int, config: dict, ids: list[str]) -> dict:
    """Grade the upload through batch, as `batch` grades one learner's folder (the same rules find the work in
    it: ../handed_in.py): a copy of its regular files (handed_in.walk: no link, no cache, no virtual environment,
    bounded) in a folder of its own, graded in a child process."""
    from ..batch.parent import run_batch

    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        stage = Path(tmp) / "submissions"
        (stage / "submission").mkdir(parents=True)
        for folder, files in walk(upload):
            for f in files:
                target = stage / "submission" / f.relative_to(upload)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, target)
        whole = config.get("submission_timeout")
        [row] = run_batch(stage, seed, float(config.get("puzzle_timeout", 60.0)), int(config.get("memory_mb", 4096)),
                          ids, jobs=1, progress=sys.stdout, submission_timeout=float(whole) if whole else None)
    return row
