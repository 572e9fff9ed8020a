"""The command line: exit status, --json shape, --seed reproducibility."""

import json
import subprocess
import sys

from grader import runner

ROOT = runner.REPO


def grader(*args):
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=ROOT, capture_output=True, text=True)


def test_json_output_has_the_documented_shape():
    proc = grader("check", "solutions", "--puzzle", "p3", "--seed", "7", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["target"] == "solutions" and out["seed"] == 7
    [p3] = out["puzzles"]
    assert p3["id"] == "p3" and p3["name"] == "data_parallel" and p3["status"] == "pass"
    assert all(set(c) >= {"name", "passed", "message"} for c in p3["checks"])
    assert len(p3["peak_bytes"]) == 4 and all(isinstance(b, int) and b > 0 for b in p3["peak_bytes"])
    assert isinstance(p3["makespan_ticks"], int) and p3["makespan_ticks"] > 0


def test_a_failing_answer_exits_1_and_names_the_check():
    proc = grader("check", "tests/naive", "--puzzle", "p3", "--seed", "5")
    assert proc.returncode == 1
    assert "FAIL updated weights" in proc.stdout and "--seed 5" in proc.stdout


def test_the_same_seed_grades_the_same_inputs():
    a, b = (json.loads(grader("check", "solutions", "-p", "p3", "--seed", "11", "--json").stdout) for _ in range(2))
    assert a == b


def test_unknown_target_is_a_usage_error():
    proc = grader("check", "no/such/folder")
    assert proc.returncode == 2 and "no such target" in proc.stderr
