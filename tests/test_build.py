"""`python -m grader build`: stubs generated from solutions/, and the staleness check."""

import json
import shutil
import subprocess
import sys

import nbformat
import pytest

from grader.core.result import NOT_ATTEMPTED
from grader.frontends import build, cli, stubs
from grader.frontends.notebooks import standalone
from grader.frontends.targets import REPO, grade_target
from grader.specs import SPECS

ROOT = REPO

SOLUTION = '''"""A puzzle."""

import torch


def step(dist, x):
    """Doc."""
    y = x + 1
    # BEGIN SOLUTION
    y = y * 2
    return y
    # END SOLUTION


class Opt:
    def __init__(self, dist):
        # BEGIN SOLUTION
        self.dist = dist
        # END SOLUTION
'''


def test_stub_replaces_each_solution_region_with_not_implemented():
    text = stubs.stub(SOLUTION, "p9_demo.py")
    assert "y = y * 2" not in text and "self.dist = dist" not in text
    assert '    raise NotImplementedError("p9: write step")\n' in text
    assert '        raise NotImplementedError("p9: write Opt.__init__")\n' in text
    assert '"""Doc."""\n    y = x + 1\n' in text  # everything outside the markers is kept
    compile(text, "p9_demo.py", "exec")


@pytest.mark.parametrize("broken", [
    SOLUTION.replace("    # END SOLUTION\n\n\nclass", "\n\nclass"),
    SOLUTION.replace("    # BEGIN SOLUTION\n    y = y * 2", "    y = y * 2"),
])
def test_unbalanced_markers_are_an_error(broken):
    with pytest.raises(stubs.BuildError):
        stubs.stub(broken, "p9_demo.py")


def test_generated_files_are_up_to_date():
    """Fails when solutions/ changed and `python -m grader build` was not run (stubs a learner edited are skipped)."""
    proc = subprocess.run([sys.executable, "-m", "grader", "build", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


def test_check_names_a_stale_stub_and_spares_an_edited_one(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "puzzles").mkdir()
    (tmp_path / "solutions" / "p9_demo.py").write_text(SOLUTION)
    build.build(tmp_path)
    assert build.stale(tmp_path) == []
    (tmp_path / "solutions" / "p9_demo.py").write_text(SOLUTION.replace("Doc.", "New doc."))
    assert build.stale(tmp_path) == ["puzzles/p9_demo.py is stale: run `python -m grader build`"]
    stub = tmp_path / "puzzles" / "p9_demo.py"
    stub.write_text(stub.read_text().replace('raise NotImplementedError("p9: write step")', "return x"))
    assert build.stale(tmp_path) == []  # the learner's work in progress is not "stale"


def test_fresh_stubs_grade_as_not_attempted(tmp_path):
    (tmp_path / "solutions").symlink_to(ROOT / "solutions")
    (tmp_path / "puzzles").mkdir()
    build.build(tmp_path)
    results = grade_target(tmp_path / "puzzles", seed=0)
    assert [r.status for r in results] == [NOT_ATTEMPTED] * len(SPECS), [(r.id, r.error) for r in results]


def checkout(tmp_path):
    """A checkout in `tmp_path`: a copy of the solutions, and what `build` makes from them."""
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    (tmp_path / "puzzles").mkdir()
    build.build(tmp_path)
    return tmp_path


def edit_solution(root, name, old, new):
    path = root / "solutions" / name
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))


def read_nb(path):
    return nbformat.read(str(path), as_version=4)


def by_id(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def test_build_leaves_a_solved_stub_alone_and_says_so(tmp_path):
    root = checkout(tmp_path)
    solved = (ROOT / "solutions" / "p3_data_parallel.py").read_text()
    (root / "puzzles" / "p3_data_parallel.py").write_text(solved)  # the learner's answer
    edit_solution(root, "p3_data_parallel.py", "Puzzle 3 — Data parallel.", "Puzzle 3 — Data parallel (new).")
    edit_solution(root, "p4_tensor_parallel.py", "Write three things:", "Write these three things:")
    done = build.build(root)
    assert (root / "puzzles" / "p3_data_parallel.py").read_text() == solved
    assert root / "puzzles" / "p4_tensor_parallel.py" in done.write  # an unedited stale stub is regenerated
    assert "left puzzles/p3_data_parallel.py alone: you have edited it" in done.kept
    assert build.stale(root) == []  # --check: the learner's work is not "stale"
    done = build.build(root, force=True)
    assert "Data parallel (new)" in (root / "puzzles" / "p3_data_parallel.py").read_text() and not done.kept


def test_build_leaves_an_edited_notebook_cell_alone_and_keeps_the_learners_cells(tmp_path):
    root = checkout(tmp_path)
    for name in (build.NOTEBOOK, build.STANDALONE_NOTEBOOK):
        nb = read_nb(root / name)
        by_id(nb, "p3").source = "def data_parallel_step(dist, x_shard, target_shard, layers, lr):\n    return 42\n"
        mine = nbformat.v4.new_code_cell("def my_helper():\n    return 1\n")
        nb.cells.insert(nb.cells.index(by_id(nb, "p3")) + 1, mine)
        by_id(nb, "tour-code").outputs = [nbformat.v4.new_output("stream", text="ran the tour\n")]
        nbformat.write(nb, str(root / name))
    edit_solution(root, "p3_data_parallel.py", "Puzzle 3 — Data parallel.", "Puzzle 3 — Data parallel (new).")
    edit_solution(root, "p3_data_parallel.py", "    loss.backward()\n", "    loss.backward()  # new\n")
    done = build.build(root)
    assert sorted(done.kept) == [f"left the p3 code cell (your answer) of {name} alone: you have edited it"
                                 for name in sorted((build.NOTEBOOK, build.STANDALONE_NOTEBOOK))]
    for name in (build.NOTEBOOK, build.STANDALONE_NOTEBOOK):
        nb = read_nb(root / name)
        ids = [c.get("id") for c in nb.cells]
        assert by_id(nb, "p3").source.endswith("return 42\n")  # the learner's answer
        assert by_id(nb, "p3-story").source.startswith("## Puzzle 3 — Data parallel (new)")  # the story is new
        assert nb.cells[ids.index("p3") + 1].source.startswith("def my_helper")  # their own cell, where it was
        assert by_id(nb, "tour-code").outputs[0].text == "ran the tour\n"  # an unchanged cell keeps its outputs
    assert build.stale(root) == []
    build.build(root, force=True)
    nb = read_nb(root / build.NOTEBOOK)
    assert "raise NotImplementedError" in by_id(nb, "p3").source and "my_helper" not in nbformat.writes(nb)


def test_an_unedited_stale_notebook_cell_is_rewritten_and_check_names_it(tmp_path):
    root = checkout(tmp_path)
    edit_solution(root, "p8_zero.py", "Puzzle 8 — ZeRO", "Puzzle 8 — ZeRO!")
    assert build.stale(root) == [f"{name} is stale: run `python -m grader build`" for name in
                                 ("puzzles/p8_zero.py", build.NOTEBOOK, build.STANDALONE_NOTEBOOK)]
    build.build(root)
    assert by_id(read_nb(root / build.NOTEBOOK), "p8-story").source.startswith("## Puzzle 8 — ZeRO!")
    assert build.stale(root) == []


def test_check_covers_what_the_standalone_notebook_carries(tmp_path, monkeypatch):
    real = standalone.package_files()
    monkeypatch.setattr(standalone, "package_files", lambda: {**real, "grader/extra.py": b"x = 1\n"})
    root = checkout(tmp_path)
    monkeypatch.setattr(standalone, "package_files", lambda: real)
    assert build.stale(root) == [f"{build.STANDALONE_NOTEBOOK} is stale: run `python -m grader build`"]


def test_a_notebook_from_an_older_build_is_replaced_unless_edited(tmp_path):
    """Notebooks written before cells had role ids recorded one digest of all their cells."""
    root = checkout(tmp_path)
    old = read_nb(root / build.NOTEBOOK)
    for i, c in enumerate(old.cells):
        c["id"] = f"cell-{i}"
    cells = [(c.cell_type, c.source, c.get("metadata", {}).get("tags", [])) for c in old.cells]
    old.metadata["puzzles"] = {"generated_from": "solutions/", "cells_digest": stubs.digest(json.dumps(cells))}
    nbformat.write(old, str(root / build.NOTEBOOK))
    assert build.NOTEBOOK in " ".join(build.stale(root))
    build.build(root)
    assert by_id(read_nb(root / build.NOTEBOOK), "p3")  # replaced: role ids now
    old.cells[5].source += "\n# mine"
    nbformat.write(old, str(root / build.NOTEBOOK))
    done = build.build(root)
    assert done.kept == [f"left {build.NOTEBOOK} alone: you have edited it, and an older build wrote it"]
    assert "# mine" in (root / build.NOTEBOOK).read_text()


def test_the_build_command_names_what_it_left_alone(tmp_path, monkeypatch, capsys):
    root = checkout(tmp_path)
    (root / "puzzles" / "p3_data_parallel.py").write_text((ROOT / "solutions" / "p3_data_parallel.py").read_text())
    edit_solution(root, "p3_data_parallel.py", "Puzzle 3 — Data parallel.", "Puzzle 3 — Data parallel (new).")
    monkeypatch.setattr(cli, "REPO", root)
    monkeypatch.setattr(cli, "in_checkout", lambda: True)
    assert cli.main(["build"]) == 0
    out = capsys.readouterr().out
    assert "left puzzles/p3_data_parallel.py alone: you have edited it (`python -m grader build --force` " \
           "overwrites it)" in out
    assert "wrote puzzles.ipynb" in out and "wrote puzzles/p3" not in out
    assert cli.main(["build", "--force"]) == 0
    assert "wrote puzzles/p3_data_parallel.py" in capsys.readouterr().out


def test_build_outside_a_checkout_says_so(monkeypatch, capsys):
    monkeypatch.setattr(cli, "in_checkout", lambda: False)
    assert cli.main(["build"]) == 2
    assert "not a checkout" in capsys.readouterr().err


def test_the_readme_badge_opens_the_notebook_the_install_cell_installs():
    from grader.frontends.notebooks.file import REPO_URL, colab_url

    readme = (ROOT / "README.md").read_text()
    assert f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url()})" in readme
    assert colab_url().startswith(REPO_URL.replace("https://github.com/", "https://colab.research.google.com/github/"))
    assert "puzzles-standalone.ipynb" in readme  # the way to Colab before the repository is published


def test_ci_runs_the_readme_test_command_and_the_slow_checks():
    command = 'pip install -e ".[dev]" && pytest tests'
    development = (ROOT / "docs" / "development.md").read_text()
    assert command in development
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command.replace("install -e", "install --quiet -e") in ci  # a line of its own: more steps follow it
    # the whole of the long checks whose representatives `pytest tests` runs: a step of its own, documented
    assert ci.index("pytest tests -m slow") == ci.index(command.replace("install -e", "install --quiet -e")) + 1
    assert "pytest tests -m slow" in development


HANDED = '''"""A broken program to fix."""


def step(x):
    # BEGIN SOLUTION
    return x * 2
    # END SOLUTION
    # BEGIN HANDED OUT: this step returns half of what it should
    # y = x / 2
    #
    # return y
    # END HANDED OUT
'''


def test_a_handed_out_program_is_the_stub_behind_one_line_that_keeps_it_from_running():
    text = stubs.stub_body(HANDED, "p20_demo.py")
    assert text.splitlines()[-4:] == [
        '    raise NotImplementedError("p20: this step returns half of what it should: delete this line to run it as '
        'handed out, then fix it")', "    y = x / 2", "", "    return y"]
    assert "x * 2" not in text and "BEGIN" not in text and "HANDED" not in text
    namespace = {}
    exec(text.replace('    raise NotImplementedError(', '    pass  # (', 1).replace('then fix it")', 'then fix it'),
         namespace)
    assert namespace["step"](4.0) == 2.0  # the program as handed out runs, once the line is gone


@pytest.mark.parametrize("broken", [
    HANDED.replace("    # END SOLUTION\n", "    # END SOLUTION\n    pass\n"),  # not right after the solution
    HANDED.replace("    # END HANDED OUT\n", ""),  # never closed
    HANDED.replace("    # y = x / 2", "    y = x / 2"),  # a line not behind "# "
])
def test_a_malformed_handed_out_region_stops_the_build(broken):
    with pytest.raises(stubs.BuildError):
        stubs.stub(broken, "p20_demo.py")
