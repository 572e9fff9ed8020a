"""What learners hand in (grader/frontends/handed_in.py, batch/submissions.py): the layouts they actually use are
graded, the same way by `batch` and by Gradescope's run_autograder, and anything ambiguous is flagged rather than
given zero in silence. A whole checkout used to get 12 x "not attempted" from batch, with a reason naming the
sandbox's /submission, while run_autograder graded the same folder correctly."""

import csv
import io
import json
import os
import shutil

import nbformat
import pytest

from grader.frontends import batch, build, cli
from grader.frontends.handed_in import find_work, lms_groups, notebook_has_work, split_lms_name
from grader.frontends.notebooks.file import build_notebook
from grader.frontends.reports import class_report, gradescope
from grader.frontends.targets import REPO

P3 = "p3_data_parallel.py"


def stubs_into(folder):
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in build.planned_files(REPO).items():
        (folder / path.name).write_text(text)


def checkout(root, solved=(P3,), notebook=True):
    """A learner's whole checkout: the stubs in puzzles/ (some solved), the notebook as generated, the course's
    solutions/ beside them (a clone of a public repository holds them), a README."""
    stubs_into(root / "puzzles")
    for name in solved:
        shutil.copy(REPO / "solutions" / name, root / "puzzles" / name)
    shutil.copytree(REPO / "solutions", root / "solutions")
    if notebook:
        nbformat.write(build.fresh_notebook(REPO), str(root / "puzzles.ipynb"))
    (root / "README.md").write_text("# my copy\n")
    return root


def test_find_work_takes_the_files_at_the_top(tmp_path):
    shutil.copytree(REPO / "tests" / "naive", tmp_path / "files")
    work = find_work(tmp_path / "files")
    assert work.path == tmp_path / "files" and work.flags == []
    assert work.note == "Graded the files at the top of the submission."


def test_a_checkout_is_graded_from_its_puzzles_folder_never_from_solutions(tmp_path):
    work = find_work(checkout(tmp_path / "alice"))
    assert work.path == tmp_path / "alice" / "puzzles"
    assert work.flags == ["more than one place holds work: graded puzzles/, not solutions/"]
    untouched = find_work(checkout(tmp_path / "bob", solved=()))  # worked in the notebook, or not at all
    assert untouched.path == tmp_path / "bob" / "puzzles.ipynb"  # never solutions/, though its files are "edited"
    assert "puzzles/ was also handed in, as generated" not in untouched.note  # solutions/ held work: named instead
    assert untouched.flags == ["more than one place holds work: graded puzzles.ipynb, not solutions/"]


def test_edited_files_win_over_a_notebook_and_both_with_work_is_flagged(tmp_path):
    root = tmp_path / "carol"
    stubs_into(root / "puzzles")
    nb = build.fresh_notebook(REPO)
    nbformat.write(nb, str(root / "puzzles.ipynb"))
    assert not notebook_has_work(root / "puzzles.ipynb")
    work = find_work(root)
    assert work.path == root / "puzzles.ipynb" and work.flags == []
    assert "puzzles/ was also handed in, as generated, and was not graded" in work.note
    shutil.copy(REPO / "solutions" / P3, root / "puzzles")
    assert find_work(root).path == root / "puzzles"
    next(c for c in nb.cells if c.get("id") == "p4").source += "\n# my answer\n"
    nbformat.write(nb, str(root / "puzzles.ipynb"))
    assert notebook_has_work(root / "puzzles.ipynb")
    work = find_work(root)
    assert work.path == root / "puzzles" and work.flags == [
        "more than one place holds work: graded puzzles/, not puzzles.ipynb"]


def test_nothing_to_grade_says_what_the_folder_holds(tmp_path):
    (tmp_path / "dave").mkdir()
    (tmp_path / "dave" / "notes.txt").write_text("")
    (tmp_path / "dave" / "venv" / "lib").mkdir(parents=True)
    work = find_work(tmp_path / "dave")
    assert work.path is None and "it holds notes.txt, venv/" in work.note


@pytest.mark.parametrize("name, expected", [
    ("alice_1234_p3_data_parallel.py", ("alice_1234", P3, 0)),
    ("lastfirst_LATE_12345_67890_p3_data_parallel-1.py", ("lastfirst_12345", P3, 1)),
    ("lastfirst_12345_67891_p11_three_d_parallel.py", ("lastfirst_12345", "p11_three_d_parallel.py", 0)),
    ("alice_1234_5678_puzzles.ipynb", ("alice_1234", "puzzles.ipynb", 0)),
    ("alice_1234_5679_helpers.py", ("alice_1234", "helpers.py", 0)),
    ("bob_p1_checkpointing.py", ("bob", "p1_checkpointing.py", 0)),
    ("p3_data_parallel.py", None), ("notes.txt", None), ("helpers.py", None),
])
def test_lms_file_names_are_split_into_learner_and_file(name, expected):
    assert split_lms_name(name) == expected


def test_an_lms_export_is_grouped_by_learner_and_the_last_version_wins(tmp_path):
    names = ["alice_1234_1_p3_data_parallel.py", "alice_1234_2_p8_zero.py", "alice_1234_3_helpers.py",
             "bob_77_9_p3_data_parallel.py", "bob_77_10_p3_data_parallel-1.py", "notes.txt"]
    for name in names:
        (tmp_path / name).write_text("x = 1\n")
    groups, rest = lms_groups(sorted(tmp_path.iterdir()))
    assert [g.name for g in groups] == ["alice_1234", "bob_77"] and [p.name for p in rest] == ["notes.txt"]
    alice, bob = groups
    assert sorted(alice.files) == ["helpers.py", P3, "p8_zero.py"]
    assert bob.files[P3].name == "bob_77_10_p3_data_parallel-1.py"
    assert "2 versions of p3_data_parallel.py" in bob.flags[0]


@pytest.fixture(scope="module")
def class_folder(tmp_path_factory):
    """A class in the layouts learners hand in: a whole checkout, a folder of files, a notebook, an LMS export's
    files, a folder with nothing to grade."""
    subs = tmp_path_factory.mktemp("layouts") / "subs"
    checkout(subs / "alice")
    (subs / "files").mkdir(parents=True)
    shutil.copy(REPO / "solutions" / P3, subs / "files")
    nbformat.write(build_notebook(REPO, solved=True), str(subs / "nora.ipynb"))
    shutil.copy(REPO / "solutions" / P3, subs / "lee_4321_55_p3_data_parallel.py")
    shutil.copy(REPO / "tests" / "naive" / P3, subs / "zed_99_1_p3_data_parallel.py")
    (subs / "empty").mkdir()
    (subs / "empty" / "README.txt").write_text("I forgot")
    (subs / "notes.txt").write_text("not a submission")
    return subs


@pytest.fixture(scope="module")
def class_rows(class_folder):
    return batch.run_batch(class_folder, 4, 60, 3000, ["p3"], jobs=2, progress=io.StringIO())


def test_batch_grades_every_layout_learners_hand_in(class_rows):
    by = {r["name"]: r for r in class_rows}
    assert list(by) == ["alice", "empty", "files", "lee_4321", "nora.ipynb", "notes.txt", "zed_99"]
    status = {n: [p.status for p in r["puzzles"]] for n, r in by.items()}
    assert status == {"alice": ["pass"], "empty": [], "files": ["pass"], "lee_4321": ["pass"], "nora.ipynb": ["pass"],
                      "notes.txt": [], "zed_99": ["fail"]}
    assert by["alice"]["graded"] == "puzzles/" and by["alice"]["flags"] == [
        "more than one place holds work: graded puzzles/, not solutions/"]
    graded = {n: r["graded"] for n, r in by.items() if not r["error"]}  # issue 30: "files" said nothing
    assert graded == {"alice": "puzzles/", "files": "its top (1 puzzle file)", "lee_4321": "1 file",
                      "nora.ipynb": "nora.ipynb", "zed_99": "1 file"}, graded
    assert (by["lee_4321"]["kind"], by["lee_4321"]["items"]) == ("files", ["lee_4321_55_p3_data_parallel.py"])
    assert by["empty"]["error"].startswith("nothing to grade: no puzzle file") and "README.txt" in by["empty"]["error"]
    assert by["notes.txt"]["kind"] == "stray"


def test_a_missing_puzzle_file_is_not_handed_in_and_names_no_sandbox_path(class_folder, tmp_path):
    subs = tmp_path / "subs"
    checkout(subs / "alice")
    [row] = batch.run_batch(subs, 4, 60, 3000, ["p1"], jobs=1, progress=io.StringIO())
    assert row["puzzles"][0].status == "not_attempted"  # a stub
    (subs / "alice" / "puzzles" / "p1_checkpointing.py").unlink()
    [row] = batch.run_batch(subs, 4, 60, 3000, ["p1"], jobs=1, progress=io.StringIO())
    error = row["puzzles"][0].error
    assert error == "not handed in: there is no p1_checkpointing.py in this submission (puzzles/)"
    assert "/submission" not in error and str(subs) not in error


def test_the_reports_have_one_row_per_learner_and_say_where_the_work_was(class_folder, class_rows, tmp_path):
    rows = class_report.stray_rows(class_folder, class_rows)
    assert [r["name"] for r in rows] == [r["name"] for r in class_rows]  # the export's files are not strays
    class_report.write_reports(rows, 4, ["p3"], csv_path=tmp_path / "r.csv", feedback_dir=tmp_path / "fb")
    table = {r["submission"]: r for r in csv.DictReader((tmp_path / "r.csv").open())}
    assert (table["alice"]["graded"], table["alice"]["points"]) == ("puzzles/", "100")
    assert "more than one place holds work" in table["alice"]["flags"]
    assert table["empty"]["points"] == "0" and table["empty"]["error"].startswith("nothing to grade")
    assert "Graded puzzles/" in (tmp_path / "fb" / "alice" / "feedback.md").read_text()


def run_autograder(tmp_path, make):
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    (root / "source" / gradescope.CONFIG).write_text(json.dumps({"puzzles": ["p3"]}))
    make(root / "submission")
    assert gradescope.autograde({"AUTOGRADER_ROOT": str(root), **os.environ}) == 0
    return json.loads((root / "results" / "results.json").read_text())


@pytest.mark.parametrize("layout", ["alice", "files", "empty"])
def test_run_autograder_grades_each_layout_as_batch_does(layout, class_folder, class_rows, tmp_path):
    data = run_autograder(tmp_path, lambda sub: shutil.copytree(class_folder / layout, sub))
    row = next(r for r in class_rows if r["name"] == layout)
    assert [t["status"] for t in data["tests"]] == ["passed" if p.status == "pass" else "failed"
                                                    for p in row["puzzles"]] or (not row["puzzles"] and
                                                                                data["score"] == 0)
    assert data["extra_data"]["flags"] == row["flags"]
    if row["error"]:
        assert row["error"] in data["output"]
    if layout == "alice":
        assert "Graded puzzles/" in data["output"] and data["score"] == 100


def test_batch_takes_puzzle_files_left_at_the_top_of_the_class_folder_as_one_submission(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(REPO / "solutions" / P3, subs)
    assert cli.main(["batch", str(subs), "-p", "p3", "--out", str(tmp_path / "r.csv"), "--seed", "2"]) == 0
    [row] = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert (row["submission"], row["p3"]) == ("subs", "pass") and "with no learner's name" in row["flags"]
