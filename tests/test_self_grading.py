"""Self-grading under pytest, as a learner types it (the checkout's conftest.py): `--puzzle p1` and `-k p1` grade
p1 alone (pytest's -k alone would take p10 to p19 too), a --target that cannot be graded is one usage error
(exit status 4) instead of a failure per puzzle, and the summary names the puzzles that passed, failed and are not
attempted. Each test runs pytest itself, in the checkout, on a folder of its own."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from grader.frontends import stubs
from grader.frontends.targets import REPO
from grader.specs import SPECS

N = len(SPECS)


@pytest.fixture
def mine(tmp_path):
    """A learner's folder: every stub as generated, p1 solved, p3 wrong (the naive answer: gradients summed)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    for solution in sorted((REPO / "solutions").glob("p*_*.py")):
        (folder / solution.name).write_text(stubs.stub(solution.read_text(), solution.name))
    shutil.copy(REPO / "solutions" / SPECS["p1"].filename, folder)
    shutil.copy(REPO / "tests" / "naive" / SPECS["p3"].filename, folder)
    return folder


def pytest_in_checkout(*args):
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def ran(proc) -> list[str]:
    """The puzzles whose test ran, from pytest's -v lines ("tests/test_puzzles.py::test_puzzle[p1] PASSED")."""
    found = re.findall(r"::test_puzzle\[(p\d+)\] (?:PASSED|FAILED|SKIPPED)", proc.stdout)
    return sorted(set(found), key=lambda pid: int(pid[1:]))


@pytest.mark.parametrize("choice, expected", [
    (["--puzzle", "p1"], ["p1"]), (["-k", "p1"], ["p1"]),
    (["--puzzle", "3,p1"], ["p1", "p3"]), (["--puzzle", "2", "--puzzle", "p1"], ["p1", "p2"]),
])
def test_one_puzzle_is_exactly_that_puzzle(choice, expected, mine):
    proc = pytest_in_checkout(f"--target={mine}", "-v", *choice)
    assert ran(proc) == expected, proc.stdout[-3000:]
    assert f"{N - len(expected)} deselected" in proc.stdout, proc.stdout[-1500:]


def test_the_readmes_one_puzzle_line_grades_one_puzzle(mine):
    [line] = [line for line in (REPO / "README.md").read_text().splitlines() if line.endswith("# one puzzle") or
              "# one puzzle (" in line and line.startswith("pytest")]
    words = line.split("#")[0].split()
    assert words[:2] == ["pytest", "--puzzle"], line
    proc = pytest_in_checkout(f"--target={mine}", "-v", *words[1:])
    assert ran(proc) == ["p3"], proc.stdout[-3000:]


def test_another_k_expression_is_pytests_own(mine):
    proc = pytest_in_checkout(f"--target={mine}", "-v", "-k", "p1 and not p11")
    assert ran(proc) == ["p1"] + [f"p{i}" for i in range(10, 20) if i != 11], proc.stdout[-3000:]


def test_a_puzzle_file_as_target_grades_that_puzzle(mine):
    proc = pytest_in_checkout(f"--target={mine / SPECS['p1'].filename}", "-v")
    assert proc.returncode == 0 and ran(proc) == ["p1"], proc.stdout[-3000:]
    other = pytest_in_checkout(f"--target={mine / SPECS['p1'].filename}", "--puzzle", "p4")
    assert other.returncode == 4 and "holds p1 only, not p4" in other.stderr, other.stderr


@pytest.mark.parametrize("target, said", [
    ("no_such_folder", "no such target: no_such_folder"),
    ("tests/corpus", "holds no puzzle file"),
    ("README.md", "is not a puzzle file"),
    ("not_a_notebook.ipynb", "is not a notebook that can be read"),
])
def test_a_target_that_cannot_be_graded_is_one_usage_error(target, said, tmp_path):
    if target.endswith(".ipynb"):
        (tmp_path / target).write_text("{ not json")
        target = str(tmp_path / target)
    proc = pytest_in_checkout(f"--target={target}")
    assert proc.returncode == 4, (proc.returncode, proc.stdout[-2000:], proc.stderr)  # pytest's usage error
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: --target {target}: ") and said in errors[0], errors
    assert "failed" not in proc.stdout and "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-2000:]


def test_an_unknown_puzzle_is_one_usage_error(mine):
    proc = pytest_in_checkout(f"--target={mine}", "--puzzle", "p99")
    assert proc.returncode == 4 and "--puzzle p99: no such puzzle" in proc.stderr, (proc.returncode, proc.stderr)


def test_the_summary_names_the_puzzles_that_passed_failed_and_are_not_attempted(mine):
    proc = pytest_in_checkout(f"--target={mine}", "--puzzle", "p1,p2,p3")
    assert proc.returncode == 1, proc.stdout[-3000:]
    summary = proc.stdout.split("training puzzles", 1)[1]
    assert "passed (1): p1 Activation checkpointing\n" in summary, summary
    assert "failed (1): p3 Data parallel\n" in summary, summary
    assert "not attempted (1): p2\n" in summary, summary


def test_the_projects_own_tests_get_no_puzzle_summary():
    proc = pytest_in_checkout("tests/test_story_code.py", "-k", "what_counts and step")
    assert proc.returncode == 0 and "training puzzles ===" not in proc.stdout, proc.stdout[-2000:]
