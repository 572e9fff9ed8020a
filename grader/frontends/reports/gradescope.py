"""Gradescope: its results.json format, and the grading that runs inside its container for each submission.

    results_json(score, seed)   one submission's points in Gradescope's format: one test per puzzle (score,
                                max_score, status, output: each check, what is wrong, the likely cause)
    find_submission(folder)     what a learner uploaded: puzzle files, a repository holding puzzles/, a notebook
    autograde()                 what the bundle's run_autograder calls: grade AUTOGRADER_ROOT/submission through
                                `batch` (the learner's code in its own process, with its limits) and write
                                AUTOGRADER_ROOT/results/results.json, whatever happens

The format (Gradescope's "Autograder Specifications"): top level `score`, `execution_time`, `output`,
`visibility`, `stdout_visibility`, `extra_data` and `tests`; each test `name`, `score`, `max_score`, `status`
("passed" or "failed"), `output`, `visibility`. Visibility is one of VISIBILITY. Gradescope shows the learner the
`output` fields and, with stdout_visibility "visible", the autograder's stdout (hidden by default: it is the
instructor's log). `gradescope_bundle.py` writes the bundle (`python -m grader gradescope OUT`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ...core.grading import fresh_seed
from ...core.result import PASS
from ...specs import SPECS
from .scoring import (PuzzleScore, SubmissionScore, budget_line, headline, one_line, parse_weights, points_text,
                      score_row)
from ..stubs import learner_edited

VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")
CONFIG = "autograder.json"  # the bundle's settings, written by gradescope_bundle.py
WHOLE = "Not graded: your submission could not be graded as a whole (see the top of this page)."


def test_output(p: PuzzleScore) -> str:
    """A puzzle's part of the page the learner reads: each check with its message, budget and likely cause."""
    lines = [f"{p.status.replace('_', ' ').upper()}: {points_text(p.points)} of {points_text(p.max_points)} points"]
    r = p.result
    if r is None or not r.checks:
        detail = (r.error if r is not None else "") or p.reason or WHOLE
        return "\n".join(lines + ([""] + detail.rstrip().splitlines() if detail else []))
    for c, score in zip(r.checks, p.checks):
        share = f" ({points_text(score.points)}/{points_text(score.max_points)})" if score.points is not None else ""
        lines.append(f"{'ok  ' if c.passed else 'FAIL'} {c.name}{share}: {c.message}")
        if budget_line(c):
            lines.append(f"     {budget_line(c)}")
        if c.diagnosis:
            lines.append(f"     likely cause: {c.diagnosis}")
    lines += [f"FAIL {c.name}: this check is missing from the result" for c in p.checks[len(r.checks):]]
    return "\n".join(lines)


def rounded_maxima(values: list[float], places: int = 4) -> list[float]:
    """`values` rounded to `places` decimals so that they still add up to their own rounded sum (the largest
    remainders round up): Gradescope's total is the sum of the tests' maxima, and 12 x 8.3333 is not 100."""
    unit = 10 ** places
    exact = [v * unit for v in values]
    units = [math.floor(x) for x in exact]
    order = sorted(range(len(values)), key=lambda i: exact[i] - units[i], reverse=True)
    for i in order[:round(sum(exact)) - sum(units)]:
        units[i] += 1
    return [u / unit for u in units]


def score_of_test(points: float, max_points: float, rounded_max: float) -> float:
    """A test's score beside its rounded maximum: full marks are exactly the maximum, a part never above it."""
    return rounded_max if points >= max_points else min(round(points, 4), rounded_max)


def results_json(s: SubmissionScore, seed: int, visibility: str = "visible", stdout_visibility: str = "hidden",
                 note: str = "") -> dict:
    """One submission's results.json (a dict; json.dumps it)."""
    for v in (visibility, stdout_visibility):
        if v not in VISIBILITY:
            raise ValueError(f"visibility {v!r}: expected one of {', '.join(VISIBILITY)}")
    maxima = rounded_maxima([p.max_points for p in s.puzzles])
    tests = [{"name": f"{p.id} {p.title}", "score": score_of_test(p.points, p.max_points, top), "max_score": top,
              "status": "passed" if p.status == PASS else "failed", "output": test_output(p),
              "visibility": visibility} for p, top in zip(s.puzzles, maxima)]
    head = [headline(s, seed)]
    if note:
        head.append(note)
    if s.error:
        head.append(f"Your submission could not be graded as a whole: {s.error.strip()}")
    if s.flags:
        head.append("Flagged for your instructor to review: " + "; ".join(one_line(f) for f in s.flags))
    return {"score": round(sum(t["score"] for t in tests), 4), "execution_time": round(s.seconds),
            "output": "\n\n".join(head), "visibility": visibility, "stdout_visibility": stdout_visibility,
            "extra_data": {"seed": seed, "kind": s.kind, "flags": s.flags}, "tests": tests}


# ---- inside Gradescope's container

SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", "node_modules", ".git"}


def _walk(folder: Path, depth: int = 4):
    """Folders and their files under `folder`, shallowest first, skipping hidden folders, caches and every
    symbolic link (an uploaded link to / must not send the search, or the copy, through the whole disk)."""
    level = [folder]
    for _ in range(depth + 1):
        nxt = []
        for d in level:
            entries = [e for e in sorted(d.iterdir()) if not e.is_symlink()]
            yield d, [e for e in entries if e.is_file()]
            nxt += [e for e in entries if e.is_dir() and not e.name.startswith(".") and e.name not in SKIPPED_DIRS]
        level = nxt


def find_submission(folder: Path) -> tuple[Path | None, str]:
    """(what to grade, a note for the learner). Puzzle files win over a notebook when any of them was edited (a
    stub as generated is not where the learner worked); a folder named puzzles/ and a notebook named
    puzzles.ipynb come first at the same depth. (None, why) when there is nothing to grade."""
    names = {s.filename for s in SPECS.values()}
    dirs, notebooks = [], []
    for d, files in _walk(folder):
        if any(f.name in names for f in files):
            dirs.append(d)
        notebooks += [f for f in files if f.suffix == ".ipynb"]
    def shallowest(paths):  # the shallowest; at the same depth puzzles/ or puzzles.ipynb, then by name
        return min(paths, key=lambda p: (len(p.relative_to(folder).parts), p.stem != "puzzles", str(p)))

    d = shallowest(dirs) if dirs else None
    nb = shallowest(notebooks) if notebooks else None
    if d is None and nb is None:
        return None, (f"No puzzle files ({', '.join(sorted(names))}) and no notebook (*.ipynb) were found in "
                      f"your submission: upload your puzzle files, or your notebook.")
    if d is not None and nb is not None:
        edited = any(learner_edited((d / n).read_text(errors="replace")) for n in names if (d / n).is_file())
        chosen, other = (d, nb) if edited else (nb, d)
        return chosen, (f"Graded {_shown(chosen, folder)}; {_shown(other, folder)} was also in your submission "
                        f"and was not graded.")
    chosen = d if d is not None else nb
    return chosen, f"Graded {_shown(chosen, folder)}."


def _shown(path: Path, folder: Path) -> str:
    rel = path.relative_to(folder)
    return "the files at the top of your submission" if rel == Path(".") else f"{rel}{'/' if path.is_dir() else ''}"


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
        item, note = find_submission(root / "submission")
        if item is None:
            row = {"name": "submission", "kind": "stray", "error": note, "puzzles": []}
            note = ""
        else:
            row = _grade(item, seed, config, ids)
        row["seconds"] = time.monotonic() - started
        _write(results, results_json(score_row(row, weights, ids), seed, note=note, **visibility))
        print(f"wrote {results}", flush=True)
    except Exception:
        traceback.print_exc(file=sys.stdout)
        ids = config.get("puzzles") or list(SPECS)
        row = {"name": "submission", "error": "the autograder failed (not your code's fault, as far as it can "
                                              "tell); your instructor has its log", "puzzles": [],
               "seconds": time.monotonic() - started}
        _write(results, results_json(score_row(row, parse_weights({}), ids), seed))
    return 0


def _grade(item: Path, seed: int, config: dict, ids: list[str]) -> dict:
    """Grade one item through batch: a private copy (regular files only, 5 folders deep at most) in a folder of
    its own, graded in a child process."""
    from ..batch.parent import run_batch

    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        stage = Path(tmp) / "submissions"
        stage.mkdir()
        name = item.name if item.suffix == ".ipynb" else "submission"
        if item.is_dir():
            for _, files in _walk(item):
                for f in files:
                    target = stage / name / f.relative_to(item)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(f, target)
        else:
            shutil.copyfile(item, stage / name)
        [row] = run_batch(stage, seed, float(config.get("timeout", 120.0)), int(config.get("memory_mb", 4096)),
                          ids, jobs=1, progress=sys.stdout)
    return row
