"""The standalone notebook (puzzles-standalone.ipynb) works on its own: copied alone into an empty folder and run
headless by a Python that does not have this project importable, its first cell unpacks the package it carries,
and every puzzle grades ("not attempted" as shipped, PASS with the solutions filled in: four puzzles in `pytest
tests`, all of them in `pytest tests -m slow`). This is the Colab path
before the repository is published: upload one file, run it."""

from __future__ import annotations

import os
import shutil

import nbformat
import pytest
from isolated import fresh_venv, kernel_spec, run
from notebook_helpers import check_outputs, errors_of, execute

from grader.frontends.notebooks.file import STANDALONE_NOTEBOOK, build_notebook
from grader.frontends.targets import REPO
from grader.specs import SPECS

pytestmark = [pytest.mark.learner,  # run on the oldest supported torch too (tests/test_torch_range.py)
              pytest.mark.xdist_group("standalone")]  # one xdist worker: its module-scoped virtual environment


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    """A kernel whose Python has torch, numpy, matplotlib and ipykernel, and not this project."""
    base = tmp_path_factory.mktemp("standalone")
    python = fresh_venv(base / "venv")
    (base / "empty").mkdir()
    proc = run(python, "-c", "import grader", cwd=base / "empty")
    assert proc.returncode != 0 and "No module named 'grader'" in proc.stderr, proc.stderr
    (base / "tmp").mkdir()
    kernel_spec(python, base / "jupyter", "isolated", TMPDIR=str(base / "tmp"))
    return base


def run_alone(nb_path, isolated, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(isolated / "jupyter"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert os.listdir(nb_path.parent) == [nb_path.name]
    nb = nbformat.read(str(nb_path), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import grader, puzzles.sim\nprint(grader.__file__, puzzles.sim.__file__)"))
    return execute(nb, nb_path.parent, kernel_name="isolated")


# The puzzles a solved standalone notebook grades in `pytest tests` (the others' cells stay as shipped): a checkpoint
# written to the simulated disk and read back, ring attention, the loader. Every puzzle: `pytest tests -m slow`.
SOME = ("p1", "p15", "p18", "p21")


@pytest.mark.parametrize("solved", [
    pytest.param(False, id="as-shipped"), pytest.param(SOME, id="solved-some"),
    pytest.param(True, id="solved", marks=pytest.mark.slow)])
def test_the_standalone_notebook_runs_alone(solved, isolated, tmp_path, monkeypatch):
    folder = tmp_path / "alone"
    folder.mkdir()
    if solved:
        nb = build_notebook(REPO, solved=True, standalone=True)
        if solved is not True:  # the cells of the puzzles not in `solved` as shipped
            shipped = {c.get("id"): c.source for c in build_notebook(REPO, standalone=True).cells}
            for c in nb.cells:
                if c.get("id") in SPECS and c.get("id") not in solved:
                    c.source = shipped[c.get("id")]
        nbformat.write(nb, str(folder / STANDALONE_NOTEBOOK))
    else:
        shutil.copy(REPO / STANDALONE_NOTEBOOK, folder / STANDALONE_NOTEBOOK)
    nb = run_alone(folder / STANDALONE_NOTEBOOK, isolated, monkeypatch)
    assert not errors_of(nb), errors_of(nb)
    shown = check_outputs(nb)
    assert set(shown) == set(SPECS)
    for spec in SPECS.values():
        expected = "PASS" if solved is True or solved and spec.id in solved else "not attempted"
        assert f"{spec.id} {spec.title}: {expected}" in shown[spec.id], (spec.id, shown[spec.id][:800])
    where = nb.cells[-1].outputs[0].text
    assert where.count(str(isolated / "tmp")) == 2, where  # the package came out of the notebook
    assert str(REPO) not in where


def test_the_notebook_exported_to_html_does_not_show_the_package_it_carries():
    """nbconvert (HTML, PDF) is how notebooks are shared and printed: the setup cell's ~440 KB of base64 opened
    the page. Its source is left out of what renders; the rest of the notebook is all there. (nbconvert comes with
    the dev extra's Jupyter; CI's environment on the oldest torch installs the learner's packages only.)"""
    HTMLExporter = pytest.importorskip("nbconvert").HTMLExporter

    standalone = nbformat.read(str(REPO / STANDALONE_NOTEBOOK), as_version=4)
    plain = nbformat.read(str(REPO / "puzzles.ipynb"), as_version=4)
    nbformat.validate(standalone)
    page, _ = HTMLExporter().from_notebook_node(standalone)
    setup = next(c for c in standalone.cells if c.get("id") == "setup")
    payload = setup.source.split("_PACKAGE = (", 1)[1].split('"')[1]
    assert len(payload) == 100 and payload not in page
    assert len(page) < len(HTMLExporter().from_notebook_node(plain)[0]) + 20_000, len(page)
    story = next(c for c in standalone.cells if c.get("id") == "p3-story")
    assert story.source.splitlines()[0].lstrip("# ") in page  # the stories still render
