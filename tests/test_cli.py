"""The command line: exit status, --json shape, --seed reproducibility, and its edges: empty or mistyped folders,
syntax errors, exits and endless loops in a learner's code, the forms of -p, --help."""

import json
import subprocess
import sys

import pytest

from grader.frontends import cli, stubs, targets
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


@pytest.fixture
def stubs_folder(tmp_path):
    """The stubs as a learner gets them, in a folder of their own."""
    folder = tmp_path / "mine"
    folder.mkdir()
    for solution in sorted((ROOT / "solutions").glob("p*_*.py")):
        (folder / solution.name).write_text(stubs.stub(solution.read_text(), solution.name))
    return folder


def answer(folder, name, old, new):
    """Put the reference answer of `name` in `folder`, with `old` replaced by `new`."""
    text = (ROOT / "solutions" / name).read_text()
    assert old in text
    (folder / name).write_text(text.replace(old, new, 1))


P3_LOSS = "    loss = loss_fn(forward(x_shard, layers), target_shard)\n"


def graded_ids(capsys) -> list[str]:
    return [p["id"] for p in json.loads(capsys.readouterr().out)["puzzles"]]


@pytest.mark.parametrize("args, expected", [
    (["-p", "3"], ["p3"]), (["-p", "P3"], ["p3"]), (["-p", "p3", "p4"], ["p3", "p4"]),
    (["-p", "p3,p4"], ["p3", "p4"]), (["-p", "p3", "-p", "p3"], ["p3"]), (["-p", "p4", "-p", "3,P4"], ["p4", "p3"]),
])
def test_the_puzzle_option_takes_every_natural_form(args, expected, stubs_folder, capsys):
    assert cli.main(["check", str(stubs_folder), *args, "--json"]) == 0
    assert graded_ids(capsys) == expected


def test_a_folder_after_the_puzzle_ids_is_the_target(stubs_folder, capsys):
    assert cli.main(["check", "-p", "p3", "p4", str(stubs_folder), "--json"]) == 0
    assert graded_ids(capsys) == ["p3", "p4"]
    assert cli.main(["check", str(stubs_folder), "-p", "p3", "nonsense"]) == 2
    assert "not a puzzle id: nonsense" in capsys.readouterr().err


@pytest.mark.parametrize("make", ["empty", "mistyped"])
def test_an_empty_or_mistyped_folder_is_an_error(make, tmp_path, capsys):
    folder = tmp_path / "answers"
    folder.mkdir()
    if make == "mistyped":  # the parent of the puzzle folder, say
        (folder / "notes.txt").write_text("")
        (folder / "puzzles").mkdir()
    assert cli.main(["check", str(folder)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "holds no puzzle file" in captured.err
    assert ("it is empty" if make == "empty" else "it holds notes.txt, puzzles/") in captured.err


def test_a_syntax_error_shows_the_line_and_a_caret(stubs_folder, capsys):
    answer(stubs_folder, "p3_data_parallel.py", P3_LOSS, "    loss = loss_fn((forward(x_shard, layers), target_shard)\n")
    assert cli.main(["check", str(stubs_folder), "-p", "p3"]) == 1
    out = capsys.readouterr().out
    line = (stubs_folder / "p3_data_parallel.py").read_text().splitlines().index(
        "    loss = loss_fn((forward(x_shard, layers), target_shard)") + 1
    assert "SyntaxError: '(' was never closed" in out and f"at p3_data_parallel.py:{line}" in out
    shown = out.splitlines()
    i = next(i for i, s in enumerate(shown) if "loss = loss_fn((forward" in s)
    assert shown[i + 1].strip() == "^" and "frozen" not in out


@pytest.mark.parametrize("where", ["in the function", "at import"])
def test_sys_exit_is_an_error_of_that_puzzle(where, stubs_folder, capsys):
    if where == "at import":
        answer(stubs_folder, "p3_data_parallel.py", "import torch\n", "import torch\nraise SystemExit(0)\n")
    else:
        answer(stubs_folder, "p3_data_parallel.py", P3_LOSS, "    raise SystemExit()\n" + P3_LOSS)
    answer(stubs_folder, "p4_tensor_parallel.py", "", "")
    assert cli.main(["check", str(stubs_folder), "-p", "p3", "p4"]) == 1  # never "all passed"
    out = capsys.readouterr().out
    assert "p3   Data parallel                ERROR" in out and "SystemExit" in out
    assert "p4   Tensor parallel              PASS" in out  # the grader went on
    assert "1 passed, 0 failed, 1 errors" in out


def test_os_exit_is_an_error_of_that_puzzle(stubs_folder):
    """In a child process: an unguarded os._exit would end the test run itself."""
    # (os reached without an import statement, as a learner who read the grader would: `import os` is refused first)
    answer(stubs_folder, "p3_data_parallel.py", P3_LOSS,
           "    os = getattr(print.__self__, '__imp' + 'ort__')('os')\n    os._exit(0)\n" + P3_LOSS)
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(stubs_folder), "-p", "p3", "p8"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "os._exit(0) was called" in proc.stdout and "p8   ZeRO (sharded Adam)          not attempted" in proc.stdout


def test_an_endless_loop_is_stopped_within_the_timeout(stubs_folder, capsys):
    answer(stubs_folder, "p3_data_parallel.py", P3_LOSS, "    while True:\n        pass\n" + P3_LOSS)
    assert cli.main(["check", str(stubs_folder), "-p", "p3", "--timeout", "0.5"]) == 1
    out = capsys.readouterr().out
    assert "TimeLimitError: rank 0 ran for more than 0.5 s" in out
    assert "python -m grader check --timeout SECONDS" in out  # the advice names a flag that exists


def test_torch_distributed_instead_of_dist_gets_a_hint(stubs_folder, capsys):
    answer(stubs_folder, "p3_data_parallel.py", "dist.all_reduce(w.grad)", "torch.distributed.all_reduce(w.grad)")
    assert cli.main(["check", str(stubs_folder), "-p", "p3"]) == 1
    assert "hint: use the `dist` your function receives" in capsys.readouterr().out


def test_help_lists_only_what_a_user_types(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "_observe" not in out and "SUPPRESS" not in out and "check" in out and "build" in out
    with pytest.raises(SystemExit):
        cli.main(["check", "--help"])
    assert "--timeout SECONDS" in capsys.readouterr().out


def test_puzzles_means_the_folder_here_and_outside_a_checkout_says_what_to_do(stubs_folder, tmp_path, monkeypatch,
                                                                               capsys):
    monkeypatch.setattr(targets, "in_checkout", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert "no folder 'puzzles'" in err and "python -m grader check FOLDER" in err
    stubs_folder.rename(tmp_path / "puzzles")
    assert cli.main(["check", "-p", "p1", "--json"]) == 0
    assert graded_ids(capsys) == ["p1"]


def test_one_puzzle_file_can_be_graded(stubs_folder, capsys):
    answer(stubs_folder, "p3_data_parallel.py", "", "")
    assert cli.main(["check", str(stubs_folder / "p3_data_parallel.py"), "--json"]) == 0
    assert graded_ids(capsys) == ["p3"]


def test_a_notebook_with_a_missing_puzzle_says_so_on_stderr(tmp_path, capsys):
    import nbformat

    from grader.frontends.notebooks.file import build_notebook

    nb = build_notebook(ROOT)
    nb.cells = [c for c in nb.cells if c.get("id") != "p2"]
    nbformat.write(nb, str(tmp_path / "mine.ipynb"))
    assert cli.main(["check", str(tmp_path / "mine.ipynb"), "-p", "p1"]) == 0
    assert "note: mine.ipynb: no code cell holds p2" in capsys.readouterr().err
    capsys.readouterr()
    assert cli.main(["check", str(tmp_path / "mine.ipynb"), "-p", "p1", "p3"]) == 0  # nothing attempted yet
    out = capsys.readouterr().out
    assert "To start: open mine.ipynb" in out and "puzzles/p1_checkpointing.py" not in out
    (tmp_path / "bad.ipynb").write_text("{not json")
    assert cli.main(["check", str(tmp_path / "bad.ipynb")]) == 2
    assert "is not a notebook that can be read" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["check", "build", "batch", "gradescope", "release", "mutate"])
def test_every_command_says_what_it_is_in_its_own_help(name, capsys):
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    out = capsys.readouterr().out
    usage, _, rest = out.partition("\n\n")
    description = rest.split("\n\n")[0]
    assert usage.startswith("usage:") and len(description.split()) >= 8 and not description.startswith(
        ("positional", "options")), out[:600]
    if name in ("build", "release", "mutate"):
        assert "for instructors" in description.lower()


@pytest.mark.parametrize("name", ["batch", "gradescope"])
def test_batch_and_gradescope_name_each_time_limit_for_what_it_limits(name, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--puzzle-timeout SECONDS" in out and "--submission-timeout SECONDS" in out
    assert "--timeout" not in out.replace("--puzzle-timeout", "").replace("--submission-timeout", "")
    assert cli.main([name, str(tmp_path / "x"), "--timeout", "30"]) == 2
    err = capsys.readouterr().err
    assert "--timeout is ambiguous" in err and "--puzzle-timeout" in err and "--submission-timeout" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args, ids, folder", [
    (["-p", "p1,p3", "SUBS"], ["p1", "p3"], "SUBS"), (["SUBS", "-p", "3", "P8"], ["p3", "p8"], "SUBS"),
    (["-p", "p3", "-p", "p1"], ["p3", "p1"], None),
])
def test_batch_takes_the_puzzle_ids_in_every_form_that_check_does(args, ids, folder):
    parsed = cli.parser().parse_args(["batch", *args])
    assert parsed.puzzle == ids and cli.positional_from_stray(parsed, "submissions") == (folder is not None)
    assert parsed.submissions == folder


def test_output_cut_short_by_its_reader_ends_quietly():
    """`python -m grader ... | head`: the reader goes away; no BrokenPipeError traceback on the terminal."""
    proc = subprocess.Popen([sys.executable, "-m", "grader", "check", "solutions", "-p", "p1", "--seed", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child writes a byte: its first write meets a closed pipe, every time
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


def test_the_notebook_card_states_each_budget_once(monkeypatch):
    """Each message says "within the budget FORMULA = VALUE": the card printed the budget again beneath it."""
    from grader.core import report

    monkeypatch.chdir(ROOT)
    [p1] = targets.grade_target("solutions", ["p1"], 3)
    html = report.to_html(p1, 3)
    budgets = [c.budget for c in p1.checks if c.budget is not None]
    assert budgets and all(html.count(report.html.escape(b.formula)) == 1 for b in budgets), html
    unstated = p1.checks[0].__class__("volume", False, "rank 0 sent 2 MiB", budget=budgets[0])
    assert report.stated_budget(unstated) == budgets[0].describe()  # a message without it still gets the line
