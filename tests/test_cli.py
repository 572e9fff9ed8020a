"""The command line: exit status, --json shape, --seed reproducibility."""

import json
import subprocess
import sys

from grader.frontends import cli
from grader.frontends.targets import REPO

ROOT = REPO


def test_python_dash_m_grader_prints_the_documented_json():
    proc = subprocess.run([sys.executable, "-m", "grader", "check", "solutions", "--puzzle", "p3", "--seed", "7",
                           "--json"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["target"] == "solutions" and out["seed"] == 7
    [p3] = out["puzzles"]
    assert p3["id"] == "p3" and p3["name"] == "data_parallel" and p3["status"] == "pass"
    assert all(set(c) >= {"name", "passed", "message"} for c in p3["checks"])
    assert len(p3["peak_bytes"]) == 4 and all(isinstance(b, int) and b > 0 for b in p3["peak_bytes"])
    assert isinstance(p3["makespan_ticks"], int) and p3["makespan_ticks"] > 0


def test_a_failing_answer_exits_1_and_names_the_check(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["check", "tests/naive", "--puzzle", "p3", "--seed", "5"]) == 1
    out = capsys.readouterr().out
    assert "FAIL updated weights" in out and "--seed 5" in out


def test_puzzles_not_attempted_exit_0(capsys, tmp_path):
    from grader.frontends import build

    (tmp_path / "solutions").symlink_to(ROOT / "solutions")
    (tmp_path / "puzzles").mkdir()
    build.build(tmp_path)
    assert cli.main(["check", str(tmp_path / "puzzles"), "-p", "p3", "-p", "p8"]) == 0
    out = capsys.readouterr().out
    assert out.count("not attempted") >= 2 and "0 passed, 0 failed, 0 errors, 2 not attempted" in out


def test_the_same_seed_grades_the_same_inputs(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    outputs = []
    for _ in range(2):
        assert cli.main(["check", "solutions", "-p", "p3", "-p", "p5", "--seed", "11", "--json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1]


def test_unknown_target_or_puzzle_is_a_usage_error(capsys):
    assert cli.main(["check", "no/such/folder"]) == 2
    assert "no such target" in capsys.readouterr().err
    assert cli.main(["check", "solutions", "-p", "p99"]) == 2
    assert "unknown puzzle" in capsys.readouterr().err


def test_plots_option_writes_the_pngs(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    assert cli.main(["check", "solutions", "-p", "p7", "--seed", "2", "--plots", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["p7_memory.png", "p7_schedule.png"], names
    assert all((tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in names)
