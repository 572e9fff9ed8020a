"""Gradescope (grader/frontends/reports/gradescope.py, gradescope_bundle.py): results.json in Gradescope's format, and a
bundle whose run_autograder grades a submission on this machine exactly as it would in Gradescope's container."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from decimal import Decimal

import jsonschema
import nbformat
import pytest

from grader.core.result import ERROR, FAIL, NOT_ATTEMPTED, PASS, Check, PuzzleResult
from grader.frontends import build, cli
from grader.frontends.reports import gradescope
from grader.frontends.reports.scoring import Weights, parse_weights, score_row
from grader.frontends.targets import REPO
from grader.specs import SPECS

pytestmark = pytest.mark.xdist_group("gradescope")  # one xdist worker: its module-scoped bundle

# Gradescope's "Autograder Specifications", results.json, as a JSON Schema: every field it documents, with its
# type; nothing else allowed. Scores are required here (the spec allows them on the tests or at the top).
VISIBILITY = ["hidden", "after_due_date", "after_published", "visible"]
FORMATS = ["text", "html", "simple_format", "md", "ansi"]
TEST = {"type": "object", "required": ["name", "score", "max_score", "status", "output"],
        "additionalProperties": False, "properties": {
            "name": {"type": "string"}, "name_format": {"enum": FORMATS}, "number": {"type": "string"},
            "score": {"type": "number"}, "max_score": {"type": "number"}, "status": {"enum": ["passed", "failed"]},
            "output": {"type": "string"}, "output_format": {"enum": FORMATS},
            "tags": {"type": "array", "items": {"type": "string"}}, "visibility": {"enum": VISIBILITY},
            "extra_data": {"type": "object"}}}
RESULTS_SCHEMA = {"type": "object", "required": ["score", "tests"], "additionalProperties": False, "properties": {
    "score": {"type": "number"}, "execution_time": {"type": "number"}, "output": {"type": "string"},
    "output_format": {"enum": FORMATS}, "test_output_format": {"enum": FORMATS},
    "test_name_format": {"enum": FORMATS}, "visibility": {"enum": VISIBILITY},
    "stdout_visibility": {"enum": VISIBILITY}, "extra_data": {"type": "object"},
    "tests": {"type": "array", "items": TEST}, "leaderboard": {"type": "array", "items": {
        "type": "object", "required": ["name", "value"], "additionalProperties": False, "properties": {
            "name": {"type": "string"}, "value": {"type": ["number", "string"]}, "order": {"enum": ["asc", "desc"]}}}}}}


def valid(data: dict, total: float = 100) -> dict:
    """Schema-valid, the top score is the tests' sum, no test above its maximum, the maxima sum to `total`."""
    jsonschema.validate(data, RESULTS_SCHEMA)
    json.dumps(data, allow_nan=False)
    assert data["score"] == pytest.approx(sum(t["score"] for t in data["tests"]))
    assert all(0 <= t["score"] <= t["max_score"] for t in data["tests"])
    assert sum(t["max_score"] for t in data["tests"]) == pytest.approx(total)
    return data


def test_the_schema_rejects_what_gradescope_would():
    good = {"score": 1, "tests": [{"name": "a", "score": 1, "max_score": 1, "status": "passed", "output": ""}]}
    jsonschema.validate(good, RESULTS_SCHEMA)
    for bad in ({**good, "score": "1"}, {**good, "visibility": "public"}, {**good, "tests": [{"name": "a"}]},
                {**good, "tests": [{**good["tests"][0], "status": "error"}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, RESULTS_SCHEMA)


def test_results_json_has_one_test_per_puzzle_with_what_is_wrong():
    checks = [Check("updated weights", False, "rank 0: layers[0].w1 off", diagnosis="summed, not averaged"),
              Check("all-reduce volume", True, "1 MiB")]
    row = {"name": "bob", "error": "", "seconds": 3.4, "flags": ["patched the ledger"], "puzzles": [
        PuzzleResult("p3", "data_parallel", SPECS["p3"].title, FAIL, checks),
        PuzzleResult("p8", "zero", SPECS["p8"].title, NOT_ATTEMPTED, error="p8: write ShardedAdam.__init__"),
        PuzzleResult("p1", "checkpointing", SPECS["p1"].title, ERROR, error="rank 0 raised KeyError: 3"),
        PuzzleResult("p2", "activation_sharding", SPECS["p2"].title, PASS, [Check("output", True, "ok")])]}
    weights = parse_weights({"p3": {"partial_credit": True}})
    data = valid(gradescope.results_json(score_row(row, weights, ["p1", "p2", "p3", "p8"]), 11))
    by = {t["name"].split()[0]: t for t in data["tests"]}
    assert (by["p2"]["score"], by["p2"]["status"]) == (25, "passed")
    assert (by["p3"]["score"], by["p3"]["status"]) == (12.5, "failed")
    assert "FAIL updated weights (0/12.5): rank 0: layers[0].w1 off" in by["p3"]["output"]
    assert "likely cause: summed, not averaged" in by["p3"]["output"]
    assert "KeyError: 3" in by["p1"]["output"] and "write ShardedAdam" in by["p8"]["output"]
    assert data["score"] == 37.5 and data["execution_time"] == 3
    assert "--seed 11" in data["output"] and "patched the ledger" in data["output"]
    assert (data["visibility"], data["stdout_visibility"]) == ("visible", "hidden")
    with pytest.raises(ValueError, match="visibility"):
        gradescope.results_json(score_row(row, Weights(), ["p3"]), 1, visibility="public")


def test_a_submission_that_failed_as_a_whole_still_has_every_test():
    row = {"name": "submission", "error": "timed out after 120 s", "puzzles": [], "seconds": 120.0}
    data = valid(gradescope.results_json(score_row(row, Weights(), list(SPECS)), 3))
    assert len(data["tests"]) == len(SPECS) and data["score"] == 0
    assert "timed out after 120 s" in data["output"]
    assert all("could not be graded as a whole" in t["output"] for t in data["tests"])


def stubs_into(folder):
    folder.mkdir(parents=True)
    for path, text in build.planned_files(REPO).items():
        (folder / path.name).write_text(text)


def autograder_root(tmp_path, config=None):
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    (root / "submission").mkdir()
    (root / "source" / gradescope.CONFIG).write_text(json.dumps(config or {}))
    return root


def test_nothing_to_grade_still_writes_results(tmp_path, capsys):
    root = autograder_root(tmp_path, {"puzzles": ["p3", "p8"]})
    (root / "submission" / "README.txt").write_text("hi")
    assert gradescope.autograde({"AUTOGRADER_ROOT": str(root)}) == 0
    data = valid(json.loads((root / "results" / "results.json").read_text()))
    assert data["score"] == 0 and len(data["tests"]) == 2
    assert "nothing to grade: no puzzle file" in data["output"] and "it holds README.txt" in data["output"]


def test_an_autograder_failure_still_writes_results_and_logs_to_stdout(tmp_path, capsys, monkeypatch):
    root = autograder_root(tmp_path)
    shutil.copytree(REPO / "tests" / "naive", root / "submission", dirs_exist_ok=True)

    def broken(*args):
        raise RuntimeError("the grader broke")

    monkeypatch.setattr(gradescope, "_grade", broken)
    assert gradescope.autograde({"AUTOGRADER_ROOT": str(root)}) == 0
    data = valid(json.loads((root / "results" / "results.json").read_text()))
    assert data["score"] == 0 and len(data["tests"]) == len(SPECS)
    assert "the autograder failed" in data["output"] and "the grader broke" not in data["output"]
    assert "RuntimeError: the grader broke" in capsys.readouterr().out  # the instructor's log


def test_an_autograder_stopped_before_it_finishes_leaves_results_that_say_so(tmp_path):
    """Gradescope stops the autograder at the assignment's time limit, and shows nothing without a results.json:
    one saying that grading did not finish is in place before grading starts."""
    root = autograder_root(tmp_path, {"puzzles": ["p3"]})
    shutil.copy(REPO / "tests" / "naive" / "p3_data_parallel.py", root / "submission")
    stuck = ("import sys, threading\nfrom grader.frontends.reports import gradescope\n"
             "def grading(*args):\n    print('grading', flush=True)\n    threading.Event().wait()\n"
             f"gradescope._grade = grading\nsys.exit(gradescope.autograde({{'AUTOGRADER_ROOT': {str(root)!r}}}))\n")
    proc = subprocess.Popen([sys.executable, "-c", stuck], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        while proc.stdout.readline().strip() != "grading":  # (the seed's line comes first)
            assert proc.poll() is None, "the autograder ended before it graded"
    finally:
        proc.kill()
        proc.wait()
    data = valid(json.loads((root / "results" / "results.json").read_text()))
    assert data["score"] == 0 and "stopped before it finished grading" in data["output"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradescope")
    weights = tmp / "weights.toml"
    weights.write_text('[p8]\nweight = 2\n\n[p3]\npartial_credit = true\nchecks = { "updated weights" = 3 }\n')
    assert cli.main(["gradescope", str(tmp / "bundle"), "--weights", str(weights), "-p", "p1", "-p", "p3",
                     "-p", "p8", "--puzzle-timeout", "120"]) == 0
    return tmp / "bundle.zip"


def test_the_bundle_has_the_scripts_at_its_root_and_no_solutions(bundle):
    with zipfile.ZipFile(bundle) as z:
        names = set(z.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
        config = json.loads(z.read(gradescope.CONFIG))
    assert {"setup.sh", "run_autograder", gradescope.CONFIG, "pyproject.toml", "README.md",
            "grader/frontends/reports/gradescope.py", "puzzles/sim.py", "puzzles/p3_data_parallel.py"} <= names
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111
    assert not any(n.startswith(("solutions/", "tests/", "bench/", "docs/", "grader/frontends/mutate/"))
                   or "__pycache__" in n for n in names)  # no reference, no instructor's tool
    stub = build.planned_files(REPO)[REPO / "puzzles" / "p3_data_parallel.py"]
    with zipfile.ZipFile(bundle) as z:
        assert z.read("puzzles/p3_data_parallel.py").decode() == stub
    assert config["puzzles"] == ["p1", "p3", "p8"] and config["weights"]["p8"] == {"weight": 2}
    assert (bundle.parent / "bundle" / "run_autograder").stat().st_mode & 0o111


def test_the_bundle_command_makes_the_parents_of_its_folder(tmp_path, capsys):
    """It said only "error: 2" (an OSError's errno) when OUT's parent did not exist; release makes parents."""
    assert cli.main(["gradescope", str(tmp_path / "new" / "deeper" / "bundle"), "-p", "p1"]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "new" / "deeper" / "bundle.zip").is_file()
    config = json.loads((tmp_path / "new" / "deeper" / "bundle" / gradescope.CONFIG).read_text())
    assert (config["puzzle_timeout"], config["submission_timeout"]) == (60, 540)


def test_the_bundle_command_refuses_bad_weights_and_existing_folders(tmp_path, capsys):
    (tmp_path / "w.toml").write_text("[p99]\nweight = 1\n")
    assert cli.main(["gradescope", str(tmp_path / "b"), "--weights", str(tmp_path / "w.toml")]) == 2
    assert "unknown key 'p99'" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    assert cli.main(["gradescope", str(tmp_path / "taken")]) == 2
    assert "exists" in capsys.readouterr().err


def run_autograder(bundle, root, python=sys.executable):
    """Gradescope's steps: unzip into source/, copy run_autograder to the root, run it."""
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=python)
    proc = subprocess.run(["bash", str(root / "run_autograder")], env=env, cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((root / "results" / "results.json").read_text()), proc.stdout


def solutions(sub):
    shutil.copytree(REPO / "solutions", sub)


def naive(sub):
    shutil.copytree(REPO / "tests" / "naive", sub)


def stub_repository(sub):  # a clone: the stubs in puzzles/ and the notebook, both as generated
    stubs_into(sub / "puzzles")
    nbformat.write(build.build_notebook(REPO), str(sub / "puzzles.ipynb"))


@pytest.mark.parametrize("make, score, statuses, graded", [
    (solutions, 100, ["passed"] * 3, "the files at the top of the submission"),
    (stub_repository, 0, ["failed"] * 3, "puzzles.ipynb"),
    (naive, 8.33, ["failed"] * 3, "the files at the top of the submission"),  # p3: 2 of its checks' 3+1+1+1
])
def test_run_autograder_grades_a_submission_locally(bundle, tmp_path, make, score, statuses, graded):
    root = tmp_path / "autograder"
    make(root / "submission")
    data, stdout = run_autograder(bundle, root)
    valid(data)
    assert f"grader from {root / 'source' / 'grader'}" in stdout  # the bundle's package, not this checkout's
    assert data["score"] == pytest.approx(score)
    assert [(t["name"].split()[0], t["max_score"]) for t in data["tests"]] == [("p1", 25), ("p3", 25), ("p8", 50)]
    assert [t["status"] for t in data["tests"]] == statuses
    assert f"Graded {graded}" in data["output"]
    if make is stub_repository:
        assert all("NOT ATTEMPTED" in t["output"] for t in data["tests"])


def test_run_autograder_writes_results_even_when_python_cannot_start(bundle, tmp_path):
    data, _ = run_autograder(bundle, tmp_path / "autograder", python="/bin/false")
    jsonschema.validate(data, RESULTS_SCHEMA)
    assert data["score"] == 0 and "failed to start" in data["output"]


def test_the_submission_is_graded_from_a_private_copy_of_its_regular_files(tmp_path, monkeypatch):
    root = autograder_root(tmp_path, {"puzzles": ["p3"]})
    sub = root / "submission"
    shutil.copy(REPO / "solutions" / "p3_data_parallel.py", sub)
    (sub / "helpers").mkdir()
    (sub / "helpers" / "util.py").write_text("X = 1\n")
    (sub / ".git").mkdir()
    (sub / ".git" / "config").write_text("")
    (sub / "everything").symlink_to("/")  # an uploaded link to the whole disk: neither searched nor copied
    (sub / "p8_zero.py").symlink_to(REPO / "solutions" / "p8_zero.py")  # nor a linked-in reference
    seen = {}

    def fake_run_batch(folder, seed, timeout, memory_mb, puzzle_ids, jobs, progress, submission_timeout):
        [item] = list(folder.iterdir())
        seen["files"] = sorted(p.relative_to(item).as_posix() for p in item.rglob("*") if p.is_file())
        seen["links"] = [p for p in item.rglob("*") if p.is_symlink()]
        seen["args"] = (timeout, memory_mb, puzzle_ids, jobs, submission_timeout)
        return [{"name": item.name, "error": "", "puzzles": [], "seconds": 0.0}]

    monkeypatch.setattr("grader.frontends.batch.parent.run_batch", fake_run_batch)
    assert gradescope.autograde({"AUTOGRADER_ROOT": str(root)}) == 0
    assert seen["files"] == ["helpers/util.py", "p3_data_parallel.py"] and seen["links"] == []
    assert seen["args"] == (60.0, 4096, ["p3"], 1, None)  # autograder.json without limits: the defaults
    valid(json.loads((root / "results" / "results.json").read_text()))


@pytest.mark.parametrize("n", [3, 7, 12])
def test_points_are_exact_decimals_that_add_up_to_the_total(n):
    """12 puzzles of 100/12 points were 8.333333333333334 each, and a results.json said 99.99999999999999: now
    every figure is a decimal of two places, and they add up to 100 exactly, in the JSON's own numbers."""
    ids = list(SPECS)[:n]
    row = {"name": "alice", "error": "", "seconds": 1.0,
           "puzzles": [PuzzleResult(p, SPECS[p].name, SPECS[p].title, PASS, [Check("output", True, "ok")])
                       for p in ids]}
    data = valid(gradescope.results_json(score_row(row, Weights(), ids), 1))
    maxima = [t["max_score"] for t in data["tests"]]
    assert data["score"] == 100 and json.dumps(data["score"]) == "100"
    assert all(round(m, 2) == m and repr(m) == repr(round(m, 2)) for m in maxima), maxima
    assert sum(Decimal(repr(m)) for m in maxima) == 100
    assert max(maxima) - min(maxima) <= 0.01 + 1e-12
    half = parse_weights({"partial_credit": True})
    row["puzzles"][0].checks += [Check("memory", False, "over"), Check("time", True, "ok")]
    data = valid(gradescope.results_json(score_row(row, half, ids), 1))
    assert "99.99999" not in json.dumps(data) and "00000000" not in json.dumps(data)


def test_each_tests_visibility_and_the_leaderboard_come_from_the_weights_file():
    """Gradescope's conventions: a visibility per puzzle, a check as a test of its own with its own visibility
    (partial credit), the page's default, and the leaderboard of a passed puzzle's figures, lower first."""
    weights = parse_weights({"visibility": "after_published", "leaderboard": ["p6 makespan", "p6 peak memory",
                                                                              "p3 makespan"],
                             "p3": {"visibility": "visible", "partial_credit": True,
                                    "check_visibility": {"all-reduce volume": "hidden"}}})
    checks = [Check("updated weights", True, "match"), Check("all-reduce volume", False, "2 MiB, over")]
    p6 = PuzzleResult("p6", "one_f_one_b", SPECS["p6"].title, PASS, [Check("bubble", True, "ok")],
                      peak_bytes=[400, 900, 300, 100], makespan_ticks=33826)
    row = {"name": "ann", "error": "", "seconds": 2.0,
           "puzzles": [PuzzleResult("p3", "data_parallel", SPECS["p3"].title, FAIL, checks), p6]}
    data = valid(gradescope.results_json(score_row(row, weights, ["p3", "p6"]), 5, weights=weights))
    tests = {t["name"]: t for t in data["tests"]}
    assert [(n, t["visibility"], t["score"], t["max_score"]) for n, t in tests.items()] == [
        ("p3 Data parallel", "visible", 25, 25), ("p3 Data parallel: all-reduce volume", "hidden", 0, 25),
        ("p6 Pipeline parallel (1F1B)", "after_published", 50, 50)]
    assert "all-reduce volume" not in tests["p3 Data parallel"]["output"].split("(and 1 more")[0]
    assert "2 MiB, over" in tests["p3 Data parallel: all-reduce volume"]["output"]
    assert data["visibility"] == "after_published"
    assert data["leaderboard"] == [{"name": "p6 makespan", "value": 33826, "order": "asc"},
                                   {"name": "p6 peak memory", "value": 900, "order": "asc"}]  # p3 failed: none


@pytest.mark.parametrize("data, words", [
    ({"visibility": "public"}, ["visibility", "after_due_date"]),
    ({"p3": {"check_visibility": {"x": "hidden"}}}, ["check_visibility", "partial_credit = true"]),
    ({"leaderboard": ["p6 speed"]}, ["leaderboard", "makespan", "peak memory"]),
    ({"leaderboard": "p6 makespan"}, ["leaderboard", "a list"]),
])
def test_bad_visibility_or_leaderboard_settings_are_refused(data, words):
    from grader.frontends.reports.scoring import WeightsError

    with pytest.raises(WeightsError) as err:
        parse_weights(data)
    assert all(w in str(err.value) for w in words), str(err.value)
