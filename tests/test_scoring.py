"""Points (grader/frontends/reports/scoring.py): defaults that sum to 100, all or nothing unless partial credit is asked
for, weights files that say what is wrong with them, and no points for anything that did not pass."""

import json
from decimal import Decimal
from fractions import Fraction

import pytest

from grader.core.result import ERROR, FAIL, NOT_ATTEMPTED, PASS, Check, PuzzleResult
from grader.frontends.reports.scoring import (
    Weights,
    WeightsError,
    load_weights,
    one_line,
    parse_weights,
    reason_of,
    score_puzzle,
    score_row,
    shares,
)
from grader.specs import SPECS

IDS = list(SPECS)


def result(pid, status, checks=(), error=""):
    checks = [Check(name, passed, f"{name} message") for name, passed in checks]
    return PuzzleResult(pid, SPECS[pid].name, SPECS[pid].title, status, checks, error=error)


P3_PASS = result("p3", PASS, [("updated weights", True), ("all-reduce volume", True)])
P3_HALF = result("p3", FAIL, [("updated weights", False), ("all-reduce volume", True)])


def test_default_points_share_100_equally_over_the_graded_puzzles():
    points = Weights().points(IDS)
    assert sum(points.values()) == 100  # exactly: decimals, not floats
    assert all(abs(v - Decimal(100) / len(IDS)) < Decimal("0.01") for v in points.values()), points
    assert all(v == v.quantize(Decimal("0.01")) for v in points.values())
    assert Weights().points(["p3", "p8"]) == {"p3": 50, "p8": 50}  # `-p p3 -p p8`: 2 graded puzzles


@pytest.mark.parametrize("whole, weights, expected", [
    ("100", [1] * 12, ["8.34"] * 4 + ["8.33"] * 8),
    ("100", [1, 1, 1], ["33.34", "33.33", "33.33"]),
    ("10", [2, 1], ["6.67", "3.33"]),
    ("1", [1] * 3, ["0.34", "0.33", "0.33"]),
    ("7.5", [0, 1], ["0", "7.50"]),
])
def test_shares_are_exact_decimals_by_the_largest_remainder(whole, weights, expected):
    got = shares(Decimal(whole), [Fraction(w) for w in weights])
    assert got == [Decimal(e) for e in expected] and sum(got) == Decimal(whole)


def test_a_total_finer_than_the_points_unit_is_refused():
    with pytest.raises(WeightsError, match="at most 2 decimals"):
        parse_weights({"total": 33.333})
    assert parse_weights({"total": 0.1}).total == Decimal("0.1")  # a tenth, exactly


def test_by_default_a_puzzle_earns_its_points_only_when_every_check_passes():
    assert score_puzzle(P3_PASS, 12.5, Weights()).points == 12.5
    half = score_puzzle(P3_HALF, 12.5, Weights())
    assert half.points == 0
    assert [(c.name, c.passed, c.points) for c in half.checks] == [("updated weights", False, None),
                                                                   ("all-reduce volume", True, None)]


def test_errors_not_attempted_and_unknown_statuses_earn_nothing_even_with_partial_credit():
    partial = parse_weights({"partial_credit": True})
    for status in (ERROR, NOT_ATTEMPTED, "partial", "something new"):
        r = result("p3", status, [("updated weights", True), ("all-reduce volume", True)])
        assert score_puzzle(r, 12.5, partial).points == 0, status


def test_partial_credit_splits_a_puzzle_over_its_checks_by_their_weights():
    w = parse_weights({"p3": {"partial_credit": True, "checks": {"updated weights": 3}}})
    s = score_puzzle(P3_HALF, 20, w)
    assert [(c.name, c.points, c.max_points) for c in s.checks] == [("updated weights", 0, 15),
                                                                    ("all-reduce volume", 5, 5)]
    assert s.points == 5
    assert score_puzzle(P3_PASS, 20, w).points == 20
    assert not w.partial("p4")  # only p3's credit is partial


def test_a_weighted_check_missing_from_a_result_counts_as_failed_not_as_free_points():
    w = parse_weights({"p3": {"partial_credit": True, "checks": {"no such check": 2}}})
    s = score_puzzle(P3_PASS, 20, w)
    assert s.points == 10 and s.checks[-1].name == "no such check" and not s.checks[-1].passed


def test_puzzle_weights_are_relative_and_the_total_is_kept():
    w = parse_weights({"total": 40, "p8": {"weight": 2}, "p1": {"weight": 0}})
    points = w.points(IDS)
    assert abs(points["p8"] - 2 * points["p3"]) <= Decimal("0.02") and points["p1"] == 0  # 6.67 and 3.33 or 3.34
    assert sum(points.values()) == 40


def test_a_row_without_puzzle_results_scores_zero_for_every_graded_puzzle():
    row = {"name": "dave", "error": "timed out after 20 s", "puzzles": [], "seconds": 20.0}
    s = score_row(row, Weights(), ["p3", "p8"])
    assert (s.kind, s.points, s.max_points) == ("folder", 0, 100)
    assert [(p.id, p.status, p.points) for p in s.puzzles] == [("p3", "error", 0), ("p8", "error", 0)]
    stray = score_row({"name": "notes.txt", "kind": "stray", "error": "not a submission", "puzzles": []},
                      Weights(), ["p3"])
    assert stray.puzzles[0].status == "not_graded" and stray.flags == [] and stray.seconds == 0
    assert score_row({"name": "carol.ipynb", "error": "", "puzzles": [P3_PASS]}, Weights(), ["p3"]).kind == "notebook"


def test_a_full_row_adds_up():
    row = {"name": "alice", "error": "", "seconds": 3.5, "flags": ["patched the ledger"],
           "puzzles": [P3_PASS, result("p8", NOT_ATTEMPTED, error="p8: write ShardedAdam.__init__")]}
    s = score_row(row, Weights(), ["p3", "p8"])
    assert (s.points, s.max_points, s.flags) == (50, 100, ["patched the ledger"])
    assert [p.reason for p in s.puzzles] == ["", "p8: write ShardedAdam.__init__"]


@pytest.mark.parametrize("data, words", [
    ({"p99": {"weight": 1}}, ["unknown key 'p99'", "p1"]),
    ({"p3": {"weight": -1}}, ["[p3] weight", "at least 0"]),
    ({"p3": {"weight": True}}, ["[p3] weight"]),
    ({"total": 0}, ["total", "above 0"]),
    ({"partial_credit": "yes"}, ["partial_credit", "true or false"]),
    ({"p3": {"checks": {"updated weights": 2}}}, ["[p3]", "partial_credit = true"]),
    ({"p3": {"wieght": 2}}, ["unknown key 'wieght'"]),
    ({"p3": 5}, ["[p3]", "expected a table"]),
])
def test_a_bad_weights_file_is_refused_with_what_to_fix(data, words):
    with pytest.raises(WeightsError) as err:
        parse_weights(data)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_all_weights_zero_is_refused():
    with pytest.raises(WeightsError, match="all weigh 0"):
        parse_weights({"p3": {"weight": 0}}).points(["p3"])


def test_weights_files_in_toml_and_json_read_the_same(tmp_path):
    toml = tmp_path / "w.toml"
    toml.write_text('total = 50\npartial_credit = false\n\n[p8]\nweight = 2\npartial_credit = true\n'
                    'checks = { "optimizer state" = 3 }\n')
    js = tmp_path / "w.json"
    js.write_text(json.dumps({"total": 50, "p8": {"weight": 2, "partial_credit": True,
                                                  "checks": {"optimizer state": 3}}}))
    assert load_weights(toml) == load_weights(js)
    assert load_weights(toml).describe(["p3", "p8"])["puzzles"]["p8"]["points"] == 33.33  # 2/3 of 50 (p3: 16.67)
    assert load_weights(None) == Weights()
    (tmp_path / "bad.toml").write_text("total = \n")
    with pytest.raises(WeightsError, match="not valid TOML"):
        load_weights(tmp_path / "bad.toml")


def test_one_line_reasons_read_well_in_a_spreadsheet():
    crash = ('crashed (exit status 1):   File "/x/nbformat/reader.py", line 25, in parse_json |     raise '
             'NotJSONError(message) from e | nbformat.reader.NotJSONError: Notebook does not appear to be JSON')
    assert one_line(crash) == ("crashed (exit status 1): nbformat.reader.NotJSONError: Notebook does not appear "
                               "to be JSON")
    tb = 'Traceback (most recent call last):\n  File "a.py", line 3, in <module>\n    x = 1/0\n        ~^~\n' \
         'ZeroDivisionError: division by zero\n'
    assert one_line(tb) == "ZeroDivisionError: division by zero"
    assert one_line("rank 2 raised ValueError: bad\n  details") == "rank 2 raised ValueError: bad"
    assert one_line("x" * 1000).endswith("…") and len(one_line("x" * 1000)) == 300
    assert one_line("") == ""


def test_the_reason_is_the_first_failing_check_or_the_error():
    assert reason_of(P3_HALF) == "updated weights: updated weights message"
    assert reason_of(P3_PASS) == ""
    assert reason_of(result("p3", ERROR, error="rank 1 raised KeyError: 3\nTraceback...")) == \
        "rank 1 raised KeyError: 3"
    assert reason_of(result("p3", ERROR)) == "error"
