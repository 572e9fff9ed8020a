"""The reports of `python -m grader batch` (grader/frontends/reports/class_report.py): the CSV an instructor opens in a
spreadsheet, the JSON with everything, a feedback file per learner with the plots, Gradescope's format; a stray
file or a broken notebook is a clear row, never a silent skip or a raw traceback."""

import csv
import json
import shutil
import subprocess
import sys

import pytest

from grader.core.result import ERROR, FAIL, PASS, Budget, Check, PuzzleResult
from grader.frontends import cli
from grader.frontends.reports import class_report
from grader.frontends.reports.scoring import Weights, parse_weights, score_row
from grader.frontends.targets import REPO
from grader.specs import SPECS

IDS = ["p3", "p8"]


def p3(status, checks, error=""):
    return PuzzleResult("p3", "data_parallel", SPECS["p3"].title, status, checks, error=error)


VOLUME = Check("all-reduce volume", False, "rank 0 all-reduced 2,097,152 bytes", measured=2097152,
               budget=Budget("volume", "2·L·d·h·8 bytes", 1048576, "bytes"),
               diagnosis="every gradient was all-reduced twice")
ROWS = [
    {"name": "alice", "error": "", "seconds": 2.0,
     "puzzles": [p3(PASS, [Check("updated weights", True, "match")]),
                 PuzzleResult("p8", "zero", SPECS["p8"].title, PASS, [Check("optimizer state", True, "ok")])]},
    {"name": "bob, the \"second\"", "error": "", "seconds": 2.0, "flags": ["rewrote the ledger\nat import"],
     "puzzles": [p3(FAIL, [Check("updated weights", True, "match"), VOLUME]),
                 PuzzleResult("p8", "zero", SPECS["p8"].title, ERROR, [],
                              error="rank 1 raised KeyError: 3\nTraceback (most recent call last):\n"
                                    '  File "p8_zero.py", line 9\nKeyError: 3')]},
    {"name": "dave", "error": "timed out after 20 s (a hang)\nmore detail", "seconds": 20.0, "puzzles": []},
    {"name": "notes.txt", "kind": "stray", "error": "not graded: notes.txt is not a submission", "puzzles": [],
     "seconds": 0.0},
]


def scores(weights=None):
    return [score_row(r, weights or Weights(), IDS) for r in ROWS]


def test_the_csv_has_points_statuses_and_one_line_reasons(tmp_path):
    path = tmp_path / "r.csv"
    class_report.write_csv(scores(), path, IDS)
    rows = list(csv.DictReader(path.open()))
    assert [r["submission"] for r in rows] == ["alice", 'bob, the "second"', "dave", "notes.txt"]
    alice, bob, dave, stray = rows
    assert (alice["points"], alice["max points"], alice["passed"], alice["p3"], alice["p3 points"]) == \
        ("100", "100", "2", "pass", "50")
    assert (bob["p3"], bob["p3 points"], bob["p8"], bob["points"]) == ("fail", "0", "error", "0")
    assert bob["p3 reason"] == "all-reduce volume: rank 0 all-reduced 2,097,152 bytes"
    assert bob["p8 reason"] == "rank 1 raised KeyError: 3"
    assert bob["flags"] == "rewrote the ledger"
    assert (dave["p3"], dave["error"]) == ("error", "timed out after 20 s (a hang)")
    assert (stray["kind"], stray["p3"], stray["points"]) == ("stray", "not_graded", "0")
    assert "not a submission" in stray["error"]
    assert all("\n" not in cell for r in rows for cell in r.values())


def test_partial_credit_shows_in_the_csv_and_the_json(tmp_path):
    weights = parse_weights({"p3": {"partial_credit": True, "checks": {"all-reduce volume": 3}}})
    class_report.write_csv(scores(weights), tmp_path / "r.csv", IDS)
    bob = list(csv.DictReader((tmp_path / "r.csv").open()))[1]
    assert (bob["p3 points"], bob["points"]) == ("12.5", "12.5")  # 1 of 4 check weights of 50 points
    class_report.write_json(scores(weights), tmp_path / "r.json", 7, weights, IDS)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["seed"] == 7 and data["weights"]["puzzles"]["p3"]["partial_credit"] is True
    [bob_p3, bob_p8] = data["submissions"][1]["puzzles"]
    assert [(c["name"], c["points"], c["max_points"]) for c in bob_p3["checks"]] == \
        [("updated weights", 12.5, 12.5), ("all-reduce volume", 0, 37.5)]
    assert bob_p3["checks"][1]["budget"]["value"] == 1048576  # the result's own fields are all there
    assert bob_p8["status"] == "error" and bob_p8["points"] == 0 and "KeyError" in bob_p8["error"]
    dave = data["submissions"][2]
    assert dave["error"].startswith("timed out") and [p["status"] for p in dave["puzzles"]] == ["error", "error"]
    assert data["submissions"][1]["flags"] == ["rewrote the ledger\nat import"]


def test_feedback_says_what_is_wrong_and_the_likely_cause(tmp_path):
    written = class_report.write_feedback(scores(), tmp_path, seed=7)
    assert [p.parent.name for p in written] == ["alice", "bob_the_second_", "dave", "notes.txt"]
    bob = written[1].read_text()
    assert "0 of 100 points" in bob and "--seed 7" in bob
    assert "**FAIL all-reduce volume**" in bob and "likely cause: every gradient was all-reduced twice" in bob
    assert "budget: 2·L·d·h·8 bytes = 1,048,576 bytes (1.00 MiB); measured 2,097,152 bytes (2.00 MiB)" in bob
    assert "KeyError: 3" in bob and "Flagged for your instructor to review" in bob
    dave = written[2].read_text()
    assert "could not be graded as a whole" in dave and "timed out after 20 s" in dave
    assert "not graded" in written[3].read_text()


def test_feedback_says_how_to_reproduce_the_grade_where_the_learner_worked():
    """A Colab learner has no command line: a notebook's feedback gives the check cell's call with the seed."""
    notebook = score_row({"name": "carol.ipynb", "kind": "notebook", "error": "", "puzzles": [p3(PASS, [])]},
                         Weights(), ["p3"])
    text = class_report.feedback_markdown(notebook, 7, {})
    assert 'check("p3", globals(), seed=7)' in text and "python -m grader" not in text
    folder = class_report.feedback_markdown(scores()[0], 7, {})
    assert "python -m grader check puzzles --seed 7" in folder and "globals()" not in folder


def test_feedback_folders_are_safe_and_distinct():
    names = class_report.unique_folders([score_row({"name": n, "error": "", "puzzles": []}, Weights(), IDS)
                                         for n in ("a b", "a_b", "../../etc", ".hidden", "")])
    assert names == ["a_b", "a_b-2", "_.._etc", "hidden", "submission"]
    assert all("/" not in n and not n.startswith(".") for n in names)


def test_every_item_of_the_folder_gets_a_row(tmp_path):
    for name in ("alice", "zoe"):
        (tmp_path / name).mkdir()
    (tmp_path / "carol.ipynb").write_text("{}")
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / ".DS_Store").write_text("")
    rows = [{"name": n, "error": "", "puzzles": [], "seconds": 1.0} for n in ("alice", "carol.ipynb", "zoe")]
    names = [(r["name"], r.get("kind")) for r in class_report.stray_rows(tmp_path, rows)]
    assert names == [("alice", None), ("carol.ipynb", None), ("notes.txt", "stray"), ("zoe", None)]


def test_batch_writes_every_report_from_the_command_line(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copytree(REPO / "solutions", subs / "alice")
    shutil.copytree(REPO / "tests" / "naive", subs / "bob")
    (subs / "broken.ipynb").write_text('{"cells": [')
    (subs / "notes.txt").write_text("my notes")
    weights = tmp_path / "weights.toml"
    weights.write_text('[p3]\npartial_credit = true\nchecks = { "updated weights" = 3 }\n')
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "grader", "batch", str(subs), "--out", str(out / "r.csv"),
                           "--json", str(out / "r.json"), "--feedback", str(out / "feedback"), "--gradescope",
                           str(out / "gs"), "--weights", str(weights), "--seed", "4", "-p", "p3", "--jobs", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r["submission"]: r for r in csv.DictReader((out / "r.csv").open())}
    assert list(rows) == ["alice", "bob", "broken.ipynb", "notes.txt"]
    assert (rows["alice"]["points"], rows["alice"]["p3"]) == ("100", "pass")
    assert (rows["bob"]["points"], rows["bob"]["p3"]) == ("33.33", "fail")  # compute and communication: 2 of 3+1+1+1
    assert rows["bob"]["p3 reason"].startswith("updated weights: ")
    broken = rows["broken.ipynb"]
    assert broken["points"] == "0" and broken["error"] and "\n" not in broken["error"]
    assert 'File "' not in broken["error"] and "Traceback" not in broken["error"]  # no raw traceback
    feedback = (out / "feedback" / "broken.ipynb" / "feedback.md").read_text()
    assert str(subs) not in feedback and "broken.ipynb is not a notebook that can be read" in feedback
    assert "Not graded" not in feedback and feedback.count("No puzzle was graded.") == 1
    assert rows["notes.txt"]["kind"] == "stray" and "not a submission" in rows["notes.txt"]["error"]
    alice = out / "feedback" / "alice"
    assert "![p3 memory](p3_memory.png)" in (alice / "feedback.md").read_text()
    for png in ("p3_memory.png", "p3_schedule.png"):
        assert (alice / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "FAIL updated weights" in (out / "feedback" / "bob" / "feedback.md").read_text()
    assert json.loads((out / "gs" / "alice.json").read_text())["score"] == 100
    data = json.loads((out / "r.json").read_text())
    assert [s["points"] for s in data["submissions"]] == [100, 33.33, 0, 0]  # 2 of p3's 6 checks, to the cent


def test_a_bad_weights_file_stops_batch_before_any_grading(tmp_path, capsys):
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    (tmp_path / "w.toml").write_text("[p3]\nweight = -1\n")
    assert cli.main(["batch", str(tmp_path / "subs"), "--weights", str(tmp_path / "w.toml"),
                     "--out", str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err
    assert "--weights" in err and "[p3] weight must be a number at least 0" in err and "Grading" not in err
    assert not (tmp_path / "r.csv").exists()


def test_no_cell_of_the_csv_opens_as_a_formula(tmp_path):
    row = {"name": "=HYPERLINK(\"http://x\")", "error": "", "seconds": 1.0,
           "puzzles": [p3(FAIL, [Check("@check", False, "=1+1")])]}
    class_report.write_csv([score_row(row, Weights(), ["p3"])], tmp_path / "r.csv", ["p3"])
    [r] = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert r["submission"] == "'=HYPERLINK(\"http://x\")" and r["p3 reason"] == "'@check: =1+1"


def test_the_class_summary_counts_each_puzzles_outcomes_and_groups_the_reasons(tmp_path):
    """Beside the CSV: per puzzle, how many passed, failed, erred, did not attempt it, and the most common reasons
    (the same failed check with its likely cause is one reason, whatever the numbers), as a table and a plot."""
    def bob_like(name, sent):
        volume = Check("all-reduce volume", False, f"rank 0 all-reduced {sent} bytes", measured=sent,
                       diagnosis="every gradient was all-reduced twice")
        return {"name": name, "error": "", "seconds": 1.0,
                "puzzles": [p3(FAIL, [Check("updated weights", True, "match"), volume]),
                            PuzzleResult("p8", "zero", SPECS["p8"].title, "not_attempted", error="p8: write it")]}

    rows = ROWS + [bob_like("erin", 2097152), bob_like("fay", 3145728)]
    class_report.write_reports(rows, 7, IDS, csv_path=tmp_path / "r.csv")
    text = (tmp_path / "r.summary.md").read_text()
    assert text.startswith("# Class summary: 5 submissions (seed 7)")  # the stray row is no submission
    [p3_row] = [line for line in text.splitlines() if line.startswith("| p3 ")]
    cells = [c.strip() for c in p3_row.strip("|").split("|")]
    assert cells[1:5] == ["1", "3", "1", "0"], p3_row  # alice passed; bob, erin, fay failed; dave timed out
    assert cells[5].startswith("all-reduce volume failed (3); error: stopped at the time limit") or \
        cells[5].startswith("all-reduce volume failed (3)"), p3_row
    assert "- all-reduce volume failed (3): bob, the \"second\", erin, fay" in text
    assert "  - likely cause (3): every gradient was all-reduced twice" in text
    [p8_row] = [line for line in text.splitlines() if line.startswith("| p8 ")]
    assert "error: KeyError (1)" in p8_row and "not attempted (2)" in p8_row
    assert "Similar submissions were not compared" in text
    png = (tmp_path / "r.summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_similar_submissions_are_found_through_renamed_names_and_never_in_what_a_learner_reads(tmp_path):
    """copydetect's winnowing on each puzzle's code, the stub's own text left out: a copy with its names changed
    and its comments dropped is found; a different answer and the stub itself are not. The pairs go to the CSV
    and the summary (the instructor's), never to the feedback (it would name another learner)."""
    import importlib.util
    import sys as _sys

    from grader.frontends.reports.similarity import compare_class, reported, similar_to

    _sys.path.insert(0, str(REPO / "bench"))
    from class_of_answers import disguise

    stub = (REPO / "puzzles" / "p3_data_parallel.py").read_text()
    answer = (REPO / "tests" / "alternatives" / "p3_flat_bucket.py").read_text()
    other = (REPO / "tests" / "alternatives" / "p3_async_handles.py").read_text()
    assert importlib.util.find_spec("copydetect") is not None  # the dev extra installs it
    p5 = (REPO / "tests" / "alternatives" / "p5_batched_p2p.py").read_text()
    found = compare_class({"ann": {"p3": answer, "p5": p5}, "ben": {"p3": disguise(answer), "p5": disguise(p5)},
                           "cat": {"p3": other}, "dan": {"p3": stub}},
                          {"p3": stub, "p5": (REPO / "puzzles" / "p5_gpipe.py").read_text()})
    p3_found = found[0]
    pairs = {(p.a, p.b): p for p in p3_found.pairs}
    assert pairs[("ann", "ben")].score >= 0.9, pairs[("ann", "ben")]
    assert [(p.a, p.b) for p in reported(found)] == [("ann", "ben"), ("ann", "ben")]  # on p3 and on p5
    assert pairs[("ann", "dan")].score == 0 and pairs[("ben", "dan")].score == 0  # the stub's text is not a match
    cells = similar_to(found)
    assert cells == {"ann": "ben: 2 of 2 puzzles the same (p3, p5)", "ben": "ann: 2 of 2 puzzles the same (p3, p5)"}
    rows = [{"name": n, "error": "", "seconds": 1.0, "similar": cells.get(n, ""),
             "puzzles": [p3(PASS, [Check("updated weights", True, "match")])]} for n in ("ann", "ben", "cat")]
    class_report.write_reports(rows, 3, ["p3"], csv_path=tmp_path / "r.csv", feedback_dir=tmp_path / "fb",
                               similarity=found)
    table = {r["submission"]: r for r in csv.DictReader((tmp_path / "r.csv").open())}
    assert table["ann"]["similar"].startswith("ben: 2 of 2") and table["cat"]["similar"] == ""
    assert "- ann and ben: 2 of 2 puzzles (p3, p5)" in (tmp_path / "r.summary.md").read_text()
    assert "| ann | ben |" in (tmp_path / "r.similarity.md").read_text()
    assert "ben" not in (tmp_path / "fb" / "ann" / "feedback.md").read_text()
