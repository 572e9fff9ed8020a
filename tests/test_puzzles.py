"""Self-grading: one test per puzzle, for the learner's files in puzzles/ (or `--target`).

A stub that still raises NotImplementedError is skipped as "not attempted"; an attempted puzzle passes or fails
with the same feedback as `python -m grader`. Run one puzzle with `pytest --puzzle p3` (or `-k p3`); grade another
folder or a notebook with `pytest --target=FOLDER_OR_NOTEBOOK` (the checkout's conftest.py: these options, and
the summary that names the puzzles that passed). Plain `pytest` runs this file only (pyproject.toml's
testpaths); the project's own suite is `pytest tests`.
"""

import pytest

from grader.core import report
from grader.core.result import NOT_ATTEMPTED, PASS
from grader.frontends.notebooks.cells import NotebookError
from grader.frontends.targets import grade_target
from grader.specs import SPECS


@pytest.mark.parametrize("puzzle", list(SPECS))
def test_puzzle(puzzle, request, grading_seed):
    target = request.config.getoption("--target")
    try:
        [result] = grade_target(target, [puzzle], grading_seed)
    except (FileNotFoundError, KeyError, NotebookError) as exc:  # nothing to grade there: say why, no traceback
        pytest.fail(f"cannot grade {target!r}: {exc.args[0] if exc.args else exc}", pytrace=False)
    if result.status == NOT_ATTEMPTED:
        pytest.skip(f"{puzzle} {result.title}: {result.error}")
    if result.status != PASS:
        pytest.fail(report.pytest_message(result, grading_seed), pytrace=False)
