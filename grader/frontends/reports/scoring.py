"""Points: how many each puzzle of a graded submission earns, under weights an instructor can set.

The default (no weights file): the N graded puzzles are worth 100/N points each, and a puzzle earns its points
when every one of its checks passes. All-or-nothing, not an equal split over the checks, because the naive answer
of each puzzle (the very thing the puzzle teaches against: no checkpointing, GPipe for 1F1B, a synchronous
all-reduce for overlap, replicated Adam for ZeRO) passes most checks: the correctness ones. Measured on
tests/naive/ with seed 3: split equally over the checks, the nineteen naive answers would earn 58 of 100 points; all
or nothing, they earn 0. A learner sees every check before submitting (`python -m grader`, `pytest`), so
all-or-nothing asks for what the learner can verify. An instructor who wants partial credit turns it on, for
all puzzles or one, and weights the checks.

The weights file, TOML (Python 3.11+) or JSON with the same structure; every key is optional:

    total = 100               # the points of the whole assignment (default 100)
    partial_credit = false    # true: a puzzle's points are split over its checks, by the checks' weights

    [p8]                      # one table per puzzle id
    weight = 2                # relative to the other graded puzzles (default 1): p8 counts double
    partial_credit = true     # this puzzle only
    checks = { "weights after k steps" = 3, "optimizer state" = 1 }   # relative; a check not named weighs 1

Gradescope's conventions (gradescope.py), in the same file:

    visibility = "visible"    # every test's: visible, hidden, after_due_date, after_published
    leaderboard = ["p6 makespan", "p6 peak memory"]   # Gradescope's leaderboard: a passed puzzle's figures

    [p6]
    visibility = "after_due_date"                        # p6's test
    check_visibility = { "1F1B schedule" = "hidden" }    # this check as a test of its own (partial credit only:
                                                         # all or nothing, the puzzle's points would tell it)

A puzzle's points are total * its weight / the sum of the graded puzzles' weights, so they always add up to
`total`. With partial credit, a passed check earns its share of its puzzle's points; a check named in the weights
but absent from a result counts as failed. A puzzle that errors, is not attempted, or has any status other than
pass or fail earns 0 (fail earns its passed checks' shares under partial credit, else 0).

Points are exact decimals of PLACES places, in every report: the shares are computed as fractions and rounded by
the largest remainder, so that they add up to their whole exactly (12 puzzles of 100 points: four of 8.34 and
eight of 8.33, never 8.333333333333334 twelve times, which sums to 99.99999999999999).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

from ...core.report import stated_budget
from ...core.result import FAIL, PASS, PuzzleResult, fmt
from ...specs import SPECS

VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")  # Gradescope's, for a test or a page
LEADERBOARD = {"makespan": "the simulated makespan, ticks", "peak memory": "the largest peak of any rank, bytes"}
PLACES = 2  # points are exact decimals with this many places
UNIT = Fraction(1, 10 ** PLACES)
DEFAULT_TOTAL = Decimal(100)


class WeightsError(ValueError):
    """A weights file that cannot be used as written: the message names the key and what is expected."""


def shares(whole: Decimal, weights: list[Fraction]) -> list[Decimal]:
    """`whole` split in proportion to `weights`, each share a decimal of PLACES places, adding up to `whole`
    exactly: every share rounded down to the unit, then the units left over go to the largest remainders (the
    earlier share first on a tie)."""
    total = sum(weights, Fraction(0))
    if not weights or total == 0:
        return [Decimal(0) for _ in weights]
    exact = [Fraction(whole) * w / total / UNIT for w in weights]  # in units
    units = [x.numerator // x.denominator for x in exact]
    left = round(Fraction(whole) / UNIT) - sum(units)
    for i in sorted(range(len(exact)), key=lambda i: (units[i] - exact[i], i))[:left]:
        units[i] += 1
    return [Decimal(u).scaleb(-PLACES) for u in units]


def number(value: Decimal) -> int | float:
    """A point value for JSON: an int when it is whole, else the float whose shortest form is the decimal."""
    return int(value) if value == value.to_integral_value() else float(value)


@dataclass
class Weights:
    total: Decimal = DEFAULT_TOTAL
    partial_credit: bool = False
    puzzle_weight: dict[str, Fraction] = field(default_factory=dict)  # id -> relative weight (default 1)
    puzzle_partial: dict[str, bool] = field(default_factory=dict)  # id -> partial credit for this puzzle
    check_weight: dict[str, dict[str, Fraction]] = field(default_factory=dict)  # id -> {check name: weight}
    visibility: str | None = None  # every Gradescope test's (None: the bundle's --visibility)
    puzzle_visibility: dict[str, str] = field(default_factory=dict)  # id -> its test's visibility
    check_visibility: dict[str, dict[str, str]] = field(default_factory=dict)  # id -> {check: its own test's}
    leaderboard: list[tuple[str, str]] = field(default_factory=list)  # (puzzle id, LEADERBOARD key)

    def partial(self, puzzle_id: str) -> bool:
        return self.puzzle_partial.get(puzzle_id, self.partial_credit)

    def points(self, puzzle_ids: list[str]) -> dict[str, Decimal]:
        """Each graded puzzle's points: `total` shared by the puzzles' relative weights (shares())."""
        weights = [self.puzzle_weight.get(p, Fraction(1)) for p in puzzle_ids]
        if sum(weights) <= 0:
            raise WeightsError(f"the graded puzzles {puzzle_ids} all weigh 0: give at least one a weight above 0")
        return dict(zip(puzzle_ids, shares(self.total, weights)))

    def describe(self, puzzle_ids: list[str]) -> dict:
        """The weights as resolved for these puzzles (what the JSON report records)."""
        return {"total": number(self.total), "puzzles": {
            p: {"points": number(pts), "partial_credit": self.partial(p),
                "check_weights": {n: float(w) for n, w in self.check_weight.get(p, {}).items()}}
            for p, pts in self.points(puzzle_ids).items()}}


def _number(value, where: str, positive: bool = False) -> Fraction:
    """A number from the file, exactly as written (0.1 is a tenth, not the nearest binary fraction)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0):
        raise WeightsError(f"{where} must be a number {'above' if positive else 'at least'} 0, not {value!r}")
    return Fraction(Decimal(str(value)))


def _total(value, where: str) -> Decimal:
    exact = _number(value, where, positive=True)
    if exact % UNIT:
        raise WeightsError(f"{where} must have at most {PLACES} decimals (points are exact to {UNIT}), not {value!r}")
    return Decimal(exact.numerator) / Decimal(exact.denominator)


def _flag(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise WeightsError(f"{where} must be true or false, not {value!r}")
    return value


def parse_weights(data: dict, where: str = "weights") -> Weights:
    if not isinstance(data, dict):
        raise WeightsError(f"{where}: expected a table of keys, not {type(data).__name__}")
    w = Weights()
    for key, value in data.items():
        if key == "total":
            w.total = _total(value, f"{where}: total")
        elif key == "partial_credit":
            w.partial_credit = _flag(value, f"{where}: partial_credit")
        elif key == "visibility":
            w.visibility = _visibility(value, f"{where}: visibility")
        elif key == "leaderboard":
            w.leaderboard = _leaderboard(value, f"{where}: leaderboard")
        elif key in SPECS:
            _parse_puzzle(w, key, value, f"{where}: [{key}]")
        else:
            raise WeightsError(f"{where}: unknown key {key!r}; expected total, partial_credit, visibility, "
                               f"leaderboard or a puzzle id ({', '.join(SPECS)})")
    for puzzle_id, checks in w.check_weight.items():
        if checks and not w.partial(puzzle_id):
            raise WeightsError(f"{where}: [{puzzle_id}] weighs its checks but partial credit is off for it, so the "
                               f"check weights would do nothing: add partial_credit = true")
    for puzzle_id, checks in w.check_visibility.items():
        if checks and not w.partial(puzzle_id):
            raise WeightsError(f"{where}: [{puzzle_id}] check_visibility makes checks tests of their own, which "
                               f"needs partial_credit = true (all or nothing, the puzzle's points would tell a "
                               f"hidden check's outcome)")
    return w


def _visibility(value, where: str) -> str:
    if value not in VISIBILITY:
        raise WeightsError(f"{where} must be one of {', '.join(VISIBILITY)}, not {value!r}")
    return value


def _leaderboard(value, where: str) -> list[tuple[str, str]]:
    if not isinstance(value, list):
        raise WeightsError(f"{where}: expected a list like [\"p6 makespan\", \"p6 peak memory\"], not {value!r}")
    out = []
    for entry in value:
        pid, _, metric = str(entry).partition(" ")
        if pid not in SPECS or metric not in LEADERBOARD:
            raise WeightsError(f"{where}: {entry!r} is not \"PUZZLE FIGURE\" (a puzzle id, then one of "
                               f"{', '.join(LEADERBOARD)})")
        out.append((pid, metric))
    return out


def _parse_puzzle(w: Weights, puzzle_id: str, table, where: str) -> None:
    if not isinstance(table, dict):
        raise WeightsError(f"{where}: expected a table (weight, partial_credit, checks), not {table!r}")
    for key, value in table.items():
        if key == "weight":
            w.puzzle_weight[puzzle_id] = _number(value, f"{where} weight")
        elif key == "partial_credit":
            w.puzzle_partial[puzzle_id] = _flag(value, f"{where} partial_credit")
        elif key == "checks":
            if not isinstance(value, dict):
                raise WeightsError(f"{where} checks: expected a table of check name = weight, not {value!r}")
            w.check_weight[puzzle_id] = {str(n): _number(v, f"{where} checks.{n!r}") for n, v in value.items()}
        elif key == "visibility":
            w.puzzle_visibility[puzzle_id] = _visibility(value, f"{where} visibility")
        elif key == "check_visibility":
            if not isinstance(value, dict):
                raise WeightsError(f"{where} check_visibility: expected a table of check name = visibility, not "
                                   f"{value!r}")
            w.check_visibility[puzzle_id] = {str(n): _visibility(v, f"{where} check_visibility.{n!r}")
                                             for n, v in value.items()}
        else:
            raise WeightsError(f"{where}: unknown key {key!r}; expected weight, partial_credit, checks, visibility "
                               f"or check_visibility")


def read_weights_file(path: Path) -> dict:
    """A weights file's contents as plain data (.json: JSON; anything else: TOML)."""
    path = Path(path)
    text = path.read_text()
    try:
        if path.suffix == ".json":
            return json.loads(text)
        import tomllib  # Python 3.11+; on 3.10, write the same structure as JSON

        return tomllib.loads(text)
    except ModuleNotFoundError:
        raise WeightsError(f"{path}: TOML needs Python 3.11 or newer; write the weights as JSON instead") from None
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are both ValueErrors
        raise WeightsError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None


def load_weights(path: Path | None) -> Weights:
    """The weights in a .toml or .json file (the defaults when `path` is None)."""
    return Weights() if path is None else parse_weights(read_weights_file(path), str(path))


# ---- scoring a submission


@dataclass
class CheckScore:
    name: str
    passed: bool
    points: Decimal | None  # None: all or nothing, so a check alone earns nothing
    max_points: Decimal | None


@dataclass
class PuzzleScore:
    id: str
    title: str
    status: str
    points: Decimal
    max_points: Decimal
    reason: str  # one line: why it did not pass ("" when it passed)
    checks: list[CheckScore]
    result: PuzzleResult | None  # None when the whole submission failed before this puzzle was graded


@dataclass
class SubmissionScore:
    name: str
    kind: str  # "folder", "files" (an LMS export's), "notebook", "stray", "broken"
    error: str
    flags: list[str]
    seconds: float
    puzzles: list[PuzzleScore]
    graded: str = ""  # what of the submission was graded ("puzzles/", "its top (3 puzzle files)", "alice.ipynb")
    note: str = ""  # what was graded and what was not, for the learner

    @property
    def points(self) -> Decimal:
        return sum((p.points for p in self.puzzles), Decimal(0))

    @property
    def max_points(self) -> Decimal:
        return sum((p.max_points for p in self.puzzles), Decimal(0))


def points_text(value) -> str:
    """12.50 -> '12.5', 12.00 -> '12', 8.34 -> '8.34': the exact decimal, without trailing zeros."""
    text = f"{Decimal(value):.{PLACES}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def headline(s: SubmissionScore, seed: int) -> str:
    """The first thing a learner reads: the points, and how to grade their own work with the same inputs, said
    for where they worked (a notebook in Colab has no command line)."""
    points = f"{points_text(s.points)} of {points_text(s.max_points)} points. Graded with seed {seed}: "
    if s.kind == "notebook":
        return points + (f'in your notebook, `check("p3", globals(), seed={seed})` in a puzzle\'s check cell (its '
                         f"id for p3) grades it with the same inputs.")
    return points + (f"`python -m grader check puzzles --seed {seed}` (or `pytest --seed {seed}`) grades your files "
                     f"with the same inputs.")


_FRAME = re.compile(r'File "[^"]*", line \d+|Traceback \(most recent call last\)')
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b")


def one_line(text: str, limit: int = 300) -> str:
    """One readable line of an error. For a traceback, even one squeezed onto a line with " | " (batch's crash
    report), what precedes the frames and the exception's own line ("crashed (exit status 1): ValueError: ...");
    otherwise the first non-empty line."""
    pieces = [p.strip() for line in str(text).splitlines() for p in line.split(" | ") if p.strip()]
    if not pieces:
        return ""
    line = pieces[0]
    frame = next((_FRAME.search(p) for p in pieces if _FRAME.search(p)), None)
    if frame is not None:
        head = _FRAME.split(pieces[0])[0].strip()  # "crashed (exit status 1):", or "" when a frame leads
        exceptions = [p for p in pieces if _EXCEPTION.match(p)]
        tail = exceptions[-1] if exceptions else pieces[-1]
        line = head if tail in head else f"{head} {tail}" if head else tail
    line = re.sub(r"\s+", " ", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def reason_of(result: PuzzleResult) -> str:
    """Why a puzzle did not pass, in one line: its first failing check, or its error."""
    if result.status == PASS:
        return ""
    failed = result.failed_checks()
    if failed:
        return one_line(f"{failed[0].name}: {failed[0].message}")
    return one_line(result.error) or result.status.replace("_", " ")


def budget_line(check) -> str:
    """A failed check's budget beside what was measured ("" when the check has no budget, passed, or states its
    budget in its own message already)."""
    if check.passed or not stated_budget(check):
        return ""
    measured = f"; measured {fmt(check.measured, check.budget.unit)}" if check.measured is not None else ""
    return f"budget: {check.budget.describe()}{measured}"


def score_puzzle(result: PuzzleResult, max_points, weights: Weights) -> PuzzleScore:
    max_points = Decimal(max_points)
    partial = weights.partial(result.id)
    named = weights.check_weight.get(result.id, {})
    present = {c.name for c in result.checks}
    rows = [(c.name, c.passed) for c in result.checks] + [(n, False) for n in named if n not in present]
    if partial:
        split = shares(max_points, [named.get(n, Fraction(1)) for n, _ in rows])
        check_scores = [CheckScore(n, passed, share if passed else Decimal(0), share)
                        for (n, passed), share in zip(rows, split)]
    else:
        check_scores = [CheckScore(n, passed, None, None) for n, passed in rows]
    if result.status == PASS and all(c.passed for c in check_scores):
        points = max_points
    elif result.status in (PASS, FAIL) and partial:
        points = sum((c.points for c in check_scores), Decimal(0))
    else:  # error, not attempted, or a status this module does not know: not passing
        points = Decimal(0)
    return PuzzleScore(result.id, result.title, result.status, points, max_points, reason_of(result), check_scores,
                       result)


def kind_of(row: dict) -> str:
    return row.get("kind") or ("notebook" if str(row["name"]).endswith(".ipynb") else "folder")


def score_row(row: dict, weights: Weights, puzzle_ids: list[str]) -> SubmissionScore:
    """Score one row of `batch.run_batch`; a puzzle without a result (the submission failed as a whole, or is no
    submission at all) scores 0 with the submission's error as its status."""
    max_points = weights.points(puzzle_ids)
    graded = {p.id: p for p in row.get("puzzles", [])}
    kind = kind_of(row)
    puzzles = []
    for pid in puzzle_ids:
        if pid in graded:
            puzzles.append(score_puzzle(graded[pid], max_points[pid], weights))
        else:
            status = "not_graded" if kind == "stray" else "error"
            reason = "" if row.get("error") else "no result for this puzzle"  # the row's error says why
            puzzles.append(PuzzleScore(pid, SPECS[pid].title if pid in SPECS else pid, status, Decimal(0),
                                       max_points[pid], reason, [], None))
    return SubmissionScore(str(row["name"]), kind, str(row.get("error", "")), list(row.get("flags") or []),
                           float(row.get("seconds", 0.0)), puzzles, str(row.get("graded", "")),
                           str(row.get("note", "")))
