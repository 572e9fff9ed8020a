"""Self-grading: one test per puzzle, for the learner's files in puzzles/ (or `--target`).

A stub that still raises NotImplementedError is skipped as "not attempted"; an attempted puzzle passes or fails
with the same feedback as `python -m grader`. Run one puzzle with `pytest -k p3`.
"""

import pytest

from grader.core import report
from grader.core.result import NOT_ATTEMPTED, PASS
from grader.frontends.targets import grade_target
from grader.specs import SPECS


@pytest.mark.parametrize("puzzle", list(SPECS))
def test_puzzle(puzzle, request, grading_seed):
    target = request.config.getoption("--target")
    [result] = grade_target(target, [puzzle], grading_seed)
    if result.status == NOT_ATTEMPTED:
        pytest.skip(f"{puzzle} {result.title}: {result.error}")
    if result.status != PASS:
        pytest.fail(report.pytest_message(result, grading_seed), pytrace=False)
