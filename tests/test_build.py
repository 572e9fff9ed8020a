"""`python -m grader build`: stubs generated from solutions/, and the staleness check."""

import subprocess
import sys

import pytest

from grader.core.result import NOT_ATTEMPTED
from grader.frontends import build, stubs
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
