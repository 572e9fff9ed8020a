"""The torch releases the project claims are the ones it passes on.

The oldest is stated once, in pyproject.toml (`torch>=X`), mirrored by torch_check.MIN_TORCH, and CI installs
exactly that release in a second environment and runs `pytest -m learner` there (.ci/run): every reference
passes, every naive answer fails, the notebook's check cells, the standalone notebook. This file holds that
chain together, and the standalone notebook's first cell to saying plainly, before anything else can fail, when
the kernel's torch is too old or missing, and what to install.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from grader.frontends.notebooks.standalone import setup_source
from grader.frontends.notebooks.torch_check import MIN_TORCH, torch_problem
from grader.frontends.targets import REPO
from grader.specs import SPECS

LEARNER = pytest.mark.learner


def pyproject_minimum() -> str:
    found = re.findall(r'"torch\s*>=\s*([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert len(found) == 1, f"pyproject.toml should ask for torch>=X exactly once; found {found}"
    return found[0]


def test_the_minimum_is_stated_once_and_the_notebook_and_ci_use_it():
    assert pyproject_minimum() == MIN_TORCH
    ci = (REPO / ".ci" / "run").read_text()
    [line] = [line for line in ci.splitlines() if line.startswith("oldest_torch=")]
    shown = subprocess.run(["bash", "-c", f"{line}\necho \"$oldest_torch\""], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert shown == MIN_TORCH, f".ci/run's `{line}` gives {shown!r}, pyproject.toml asks for torch>={MIN_TORCH}"
    assert 'torch==$oldest_torch' in ci and "-m learner" in ci
    assert f'torch_problem("{MIN_TORCH}")' in setup_source()


def learner_selection(session, wanted: set[str]) -> set[str]:
    """Of the tests `pytest tests -m learner` selects, those in `wanted` and more. A test this session collected
    with the learner marker is one -m selects (the marker is all it looks at), so where the session collected
    them all (as `pytest tests` does, slow ones included before they are left out: tests/conftest.py) that is the
    answer; else pytest is asked to collect `-m learner` on its own."""
    collected = getattr(session.config, "collected_items", session.items)
    here = {item.nodeid.split("@")[0] for item in collected if any(m.name == "learner" for m in item.iter_markers())}
    if wanted <= here:
        return here
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "learner",
                           "-p", "no:cacheprovider", "tests"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return set(proc.stdout.splitlines())


def test_the_learner_selection_holds_every_puzzle_to_the_oldest_torch(request):
    """What CI runs on the oldest torch: each puzzle's reference (two seeds) and naive answer, a puzzle added
    later included, both notebooks as a learner runs them, and this file's first-cell checks."""
    wanted = {f"tests/test_reference_and_naive.py::test_reference_solution_passes[{p}-{seed}]"
              for p in SPECS for seed in (0, 1)}
    wanted |= {f"tests/test_reference_and_naive.py::test_naive_answer_fails_the_intended_check[{p}]" for p in SPECS}
    wanted |= {"tests/test_notebook.py::test_notebook_runs_top_to_bottom[as-shipped]",
               "tests/test_notebook.py::test_notebook_runs_top_to_bottom[solved-some]",
               "tests/test_notebook.py::test_notebook_runs_top_to_bottom[solved]",
               "tests/test_standalone.py::test_the_standalone_notebook_runs_alone[as-shipped]",
               "tests/test_standalone.py::test_the_standalone_notebook_runs_alone[solved]",
               "tests/test_standalone.py::test_the_standalone_notebook_runs_alone[solved-some]",
               "tests/test_torch_range.py::test_the_first_cell_stops_at_too_old_a_torch_and_says_what_to_install",
               "tests/test_torch_range.py::test_the_notebooks_kernel_runs_the_torch_under_test"}
    selected = learner_selection(request.session, wanted)
    assert not wanted - selected, f"not in `pytest -m learner`: {sorted(wanted - selected)}"


@LEARNER
def test_the_notebooks_kernel_runs_the_torch_under_test(tmp_path):
    """The notebook tests run a "python3" kernel: on the oldest torch's environment it must be that environment's
    Python, or CI's second run would grade the notebook on another torch without a word."""
    import nbformat
    import torch
    from notebook_helpers import execute

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch; print(torch.__version__)")])
    outputs = execute(nb, tmp_path).cells[0].outputs
    shown = "".join(o.text for o in outputs if o.get("name") == "stdout").strip()  # torch 2.2 warns on stderr
    assert shown == str(torch.__version__)


@pytest.mark.parametrize("version, too_old", [("2.1.2", True), ("1.13.1+cpu", True), ("2.2.0a0+git1234", False),
                                              ("2.2.0", False), ("2.2", False), ("2.10.0", False),
                                              ("3.0.0", False), ("unknown", True)])
def test_versions_are_compared_as_numbers(version, too_old, monkeypatch):
    """2.10 is newer than 2.2 (as text it sorts before); a local build's suffix (+cpu, a0+git) is no release."""
    fake = type(sys)("torch")
    fake.__version__ = version
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert (torch_problem("2.2") is not None) == too_old


def run_first_cell(tmp_path, fake_torch: str | None, isolated: bool = False):
    """The standalone notebook's first cell, run as a script by a Python whose `torch` is `fake_torch` (the
    source of a module standing in for it), or none at all (`isolated`: no site-packages)."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "cell.py").write_text(setup_source())
    env = {"TMPDIR": str(tmp_path / "tmp"), "PATH": "/usr/bin:/bin"}
    if fake_torch is not None:
        (tmp_path / "fake" / "torch").mkdir(parents=True)
        (tmp_path / "fake" / "torch" / "__init__.py").write_text(fake_torch)
        env["PYTHONPATH"] = str(tmp_path / "fake")
    args = [sys.executable, "-S"] if isolated else [sys.executable]
    proc = subprocess.run([*args, str(tmp_path / "cell.py")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    unpacked = list((tmp_path / "tmp").glob("training-puzzles-*"))
    return proc, unpacked


def the_remedy_is_named(text: str) -> bool:
    return (f'!pip install "torch>={MIN_TORCH}"' in text and "Restart session" in text
            and "run this cell again" in text)


@LEARNER
def test_the_first_cell_stops_at_too_old_a_torch_and_says_what_to_install(tmp_path):
    proc, unpacked = run_first_cell(tmp_path, '__version__ = "2.1.2+cu121"\n')
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"RuntimeError: These puzzles need torch {MIN_TORCH} or newer; this kernel has torch "
                           f"2.1.2+cu121."), proc.stderr[-1500:]
    assert the_remedy_is_named(last), last
    assert unpacked == [] and "ready" not in proc.stdout  # it stopped before unpacking anything


@LEARNER
def test_the_first_cell_names_a_missing_or_broken_torch(tmp_path):
    (tmp_path / "missing").mkdir()
    proc, unpacked = run_first_cell(tmp_path / "missing", None, isolated=True)
    last = proc.stderr.strip().splitlines()[-1]
    assert "torch could not be imported (ModuleNotFoundError(\"No module named 'torch'\"))" in last, proc.stderr
    assert the_remedy_is_named(last) and unpacked == []
    (tmp_path / "broken").mkdir()
    proc, unpacked = run_first_cell(tmp_path / "broken", 'raise OSError("libcudnn.so.8: cannot open shared '
                                                         'object file")\n')
    last = proc.stderr.strip().splitlines()[-1]
    assert "torch could not be imported (OSError('libcudnn.so.8: cannot open shared object file'))" in last, last
    assert the_remedy_is_named(last) and unpacked == []


@LEARNER
def test_the_first_cell_goes_on_with_the_oldest_supported_torch(tmp_path):
    """The check lets the minimum itself through (the package's own imports need no real torch to get this far)."""
    proc, unpacked = run_first_cell(tmp_path, f'__version__ = "{MIN_TORCH}.0"\n')
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "The puzzles' package is ready." in proc.stdout and len(unpacked) == 1
