"""Deliberately wrong answers, one file each under tests/wrong/ (named pN_<mistake>.py): each must fail exactly
the checks it declares in EXPECTED_FAILURES, and the feedback must name the mistake (DIAGNOSIS is a phrase the
failing check's diagnosis or message must contain). EXPECTED_STATUS may say "error" for answers that crash or
deadlock, with DIAGNOSIS then a phrase of the error text. MISTAKE says, in words, what the real mistake is
(bench/bench_verdicts.py reads it).

A file that declares NEEDS = "<branch>" is a cheat or mistake whose catching waits for work on that branch (the
integrity checks, the simulator's fidelity): it is skipped here, with that reason, until the branch is merged."""

from pathlib import Path

import pytest

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_file
from grader.core import report
from grader.core.result import FAIL
from grader.specs import SPECS

WRONG = sorted((Path(__file__).parent / "wrong").glob("p*_*.py"))


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_answer_is_caught_and_named(path):
    spec = SPECS[path.stem.split("_")[0]]
    answer = load_module(path)
    if getattr(answer, "NEEDS", None):
        pytest.skip(f"waits for {answer.NEEDS}: {answer.MISTAKE}")
    result = grade_file(spec, path, seed=7)
    message = report.pytest_message(result, 7)
    expected_status = getattr(answer, "EXPECTED_STATUS", FAIL)
    assert result.status == expected_status, message
    if expected_status == FAIL:
        failed = {c.name: c for c in result.checks if not c.passed}
        assert set(failed) == set(answer.EXPECTED_FAILURES), message
        assert any(answer.DIAGNOSIS in c.diagnosis or answer.DIAGNOSIS in c.message for c in failed.values()), message
    else:
        assert answer.DIAGNOSIS in result.error, message


@pytest.mark.parametrize("path", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_answer_declares_its_mistake(path):
    answer = load_module(path)
    assert isinstance(getattr(answer, "MISTAKE", None), str) and answer.MISTAKE, f"{path.name} declares no MISTAKE"
    assert answer.DIAGNOSIS, f"{path.name} declares no DIAGNOSIS"
    assert hasattr(answer, "EXPECTED_FAILURES") != hasattr(answer, "EXPECTED_STATUS"), \
        f"{path.name} must declare EXPECTED_FAILURES (checks it fails) or EXPECTED_STATUS (an error), not both"
