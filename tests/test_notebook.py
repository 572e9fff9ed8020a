"""The generated notebook: its layout, headless execution, and grading a notebook like a folder."""

import nbformat
import pytest
from nbclient import NotebookClient

from grader.core.result import NOT_ATTEMPTED, PASS
from grader.frontends.notebook_file import build_notebook, tagged_sources
from grader.frontends.targets import REPO, grade_target
from grader.specs import SPECS

ROOT = REPO


def test_each_puzzle_has_its_story_a_tagged_stub_and_a_check_cell():
    nb = build_notebook(ROOT)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    for spec in SPECS.values():
        i = tags.index([spec.id])
        assert nb.cells[i - 1].cell_type == "markdown" and nb.cells[i - 1].source.startswith("## Puzzle")
        assert 'raise NotImplementedError' in nb.cells[i].source
        assert tags[i + 1] == [f"{spec.id}-check"] and f'check("{spec.id}"' in nb.cells[i + 1].source
    assert "google.colab" in nb.cells[1].source  # the install cell acts only in Colab


def test_entry_names_are_unique_across_puzzles():
    """All puzzles share one notebook namespace: two puzzles defining the same name would grade each other's code."""
    names = [name for spec in SPECS.values() for name in spec.entries]
    assert len(names) == len(set(names)), names


def run_headless(nb):
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb


def outputs_of(cell) -> str:
    text = []
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            text.append(f"ERROR {out.ename}: {out.evalue}")
        text.append(out.get("text", ""))
        text.extend(str(v) for k, v in out.get("data", {}).items() if k in ("text/html", "text/plain"))
    return "\n".join(text)


@pytest.mark.parametrize("solved, expected", [(False, "not attempted"), (True, "PASS")])
def test_notebook_runs_top_to_bottom(solved, expected):
    nb = run_headless(build_notebook(ROOT, solved=solved))
    errors = [outputs_of(c) for c in nb.cells if any(o.output_type == "error" for o in c.get("outputs", []))]
    assert not errors, errors
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if tags and tags[0].endswith("-check"):
            assert f": {expected}" in outputs_of(cell), (tags, outputs_of(cell)[:500])


def test_grading_a_notebook_takes_its_tagged_cells(tmp_path):
    solved = tmp_path / "solved.ipynb"
    nbformat.write(build_notebook(ROOT, solved=True), str(solved))
    assert set(tagged_sources(solved)) >= set(SPECS)
    assert [r.status for r in grade_target(solved, seed=0)] == [PASS] * len(SPECS)
    stubs = tmp_path / "stubs.ipynb"
    nbformat.write(build_notebook(ROOT), str(stubs))
    assert [r.status for r in grade_target(stubs, seed=0)] == [NOT_ATTEMPTED] * len(SPECS)
