"""pytest options for self-grading: `pytest --target solutions` (or a folder, or a notebook), `--puzzle p3` (one
puzzle), `--seed N`; and what pytest says of the puzzles at the end (which passed, which failed, which are not
attempted).

They live at the top of the checkout, not in tests/, so that pytest knows them before it collects: plain `pytest`
collects only tests/test_puzzles.py (pyproject.toml's testpaths), and in `pytest --target solutions` pytest first
takes `solutions` for a path to collect, and loads the conftest.py files above that path only.

Choosing puzzles: `--puzzle p3` (3, P3, p3,p4; repeatable) grades exactly those. `-k p1`, pytest's own way, would
also pick p10 to p19 (it matches any test name that contains "p1"), so a -k that is exactly one puzzle id means
that puzzle alone among the self-grading tests; any other -k expression is pytest's, unchanged.

A --target that cannot be graded (no such folder, a folder without puzzle files, a file that is not a notebook)
is one usage error, pytest's exit status 4, as `python -m grader check` gives one error and status 2: not one
failure per puzzle.
"""

import re
import secrets
import shutil

import pytest

PUZZLE_TEST = "test_puzzle"  # tests/test_puzzles.py's test, one per puzzle (its parameter `puzzle`)


def pytest_addoption(parser):
    group = parser.getgroup("training puzzles")
    group.addoption("--target", default="puzzles",
                    help="what tests/test_puzzles.py grades: 'puzzles' (default), 'solutions', a folder laid out like "
                         "puzzles/, one puzzle file, or a notebook")
    group.addoption("--puzzle", action="append", default=[], metavar="ID",
                    help="grade only this puzzle: --puzzle p3 (or 3, or p3,p4; repeatable). `-k p3` works too")
    group.addoption("--seed", type=int, default=None, help="the grading seed (default: a fresh one, printed)")


def pytest_configure(config):
    seed = config.getoption("--seed")
    config.grading_seed = seed if seed is not None else secrets.randbelow(1_000_000)
    config.puzzle_outcomes = {}  # puzzle id -> "passed", "failed" or "not attempted", as the tests report them


def pytest_report_header(config):
    return (f"training puzzles: grading target {config.getoption('--target')!r}, "
            f"seed {config.grading_seed} (reproduce with --seed {config.grading_seed})")


def puzzle_of(item) -> str | None:
    """The puzzle a self-grading test grades, or None for any other test."""
    if getattr(item, "originalname", None) != PUZZLE_TEST or item.path.name != "test_puzzles.py":
        return None
    return item.callspec.params.get("puzzle")


def asked_puzzles(config) -> list[str] | None:
    """The puzzles --puzzle names, or the one a -k of exactly one puzzle id names; None when neither narrows."""
    from grader.frontends.targets import normalize_puzzle_id
    from grader.specs import SPECS

    words = [w for value in config.getoption("--puzzle") for w in re.split(r"[,\s]+", value) if w]
    keyword = (config.getoption("keyword") or "").strip()
    if not words and normalize_puzzle_id(keyword) is None:
        return None
    ids = []
    for word in words or [keyword]:
        pid = normalize_puzzle_id(word)
        if pid not in SPECS:
            raise pytest.UsageError(f"--puzzle {word}: no such puzzle (give p1..p{len(SPECS)}, 3, P3, or p3,p4)")
        ids.append(pid)
    return ids


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: they then see only the puzzles chosen here
def pytest_collection_modifyitems(config, items):
    graded = [item for item in items if puzzle_of(item)]
    if not graded:
        return
    from grader.frontends.notebooks.cells import NotebookError
    from grader.frontends.targets import check_target

    target = config.getoption("--target")
    try:
        only = check_target(target)  # None, or the one puzzle a puzzle file holds
    except (FileNotFoundError, KeyError, NotebookError) as exc:
        raise pytest.UsageError(f"--target {target}: {exc.args[0] if exc.args else exc}") from None
    asked = asked_puzzles(config)
    if only and asked and only not in asked:
        raise pytest.UsageError(f"--target {target} holds {only} only, not {', '.join(asked)}")
    keep = [only] if only else asked
    if keep is None:
        return
    deselected = [item for item in graded if puzzle_of(item) not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Note what became of each puzzle, for the summary at the end."""
    report = (yield).get_result()
    puzzle = puzzle_of(item)
    if puzzle is None or report.passed and report.when != "call":
        return
    item.config.puzzle_outcomes[puzzle] = ("not attempted" if report.skipped else
                                           "failed" if report.failed else "passed")


def pytest_terminal_summary(terminalreporter, config):
    """The puzzles by what became of them, by name: pytest's own summary counts them, and names only those that
    did not pass."""
    outcomes = config.puzzle_outcomes
    if not outcomes:
        return
    from grader.specs import SPECS

    width = shutil.get_terminal_size((100, 24)).columns - 1
    terminalreporter.write_sep("=", "training puzzles")
    for what in ("passed", "failed", "not attempted"):
        ids = [pid for pid in SPECS if outcomes.get(pid) == what]
        if ids:
            named = [f"{pid} {SPECS[pid].title}" if what != "not attempted" else pid for pid in ids]
            for line in wrapped(f"{what} ({len(ids)}): ", named, width):
                terminalreporter.write_line(line)


def wrapped(head: str, items: list[str], width: int) -> list[str]:
    """`head` and the items, comma-separated, in lines of at most `width` characters, never inside an item."""
    lines, line = [], head
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if line.strip() and len(line) + len(piece) > width:
            lines.append(line.rstrip())
            line = "    "
        line += piece + " "
    return lines + [line.rstrip()]
