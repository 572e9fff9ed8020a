"""For every puzzle: the reference solution passes every check and budget, and the naive answer fails exactly the
check it should fail, with a message a learner can act on. A budget that the reference misses, or that the naive
answer meets, is a bug in the puzzle."""

from pathlib import Path

import pytest

from grader.backends.learner_code import load_module
from grader.core import report
from grader.core.result import FAIL, PASS
from grader.frontends.targets import grade_target
from grader.specs import SPECS

NAIVE = Path(__file__).parent / "naive"
pytestmark = pytest.mark.learner  # run on the oldest supported torch too (tests/test_torch_range.py)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("puzzle", list(SPECS))
def test_reference_solution_passes(puzzle, seed):
    [result] = grade_target("solutions", [puzzle], seed)
    assert result.status == PASS, report.pytest_message(result, seed)


@pytest.mark.parametrize("puzzle", list(SPECS))
def test_naive_answer_fails_the_intended_check(puzzle):
    """Each tests/naive/pN_*.py declares EXPECTED_FAILURES (check names) and DIAGNOSIS (a phrase the failure
    message or diagnosis must contain)."""
    path = NAIVE / SPECS[puzzle].filename
    assert path.exists(), f"{puzzle} has no naive answer at {path}"
    naive = load_module(path)
    expected_failures, diagnosis = naive.EXPECTED_FAILURES, naive.DIAGNOSIS
    [result] = grade_target(NAIVE, [puzzle], seed=3)
    assert result.status == FAIL, report.pytest_message(result, 3)
    failed = {c.name: c for c in result.checks if not c.passed}
    assert set(failed) == expected_failures, report.pytest_message(result, 3)
    assert any(diagnosis in c.diagnosis or diagnosis in c.message for c in failed.values()), \
        report.pytest_message(result, 3)
