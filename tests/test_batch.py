"""`python -m grader batch`: a class of submissions, each puzzle in a sandbox of its own; the bad ones get error
rows or error puzzles, and the others are graded as usual. (The adversarial cases: test_batch_sandbox.py.)"""

import csv
import io
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import nbformat
import pytest
import torch

from grader.backends.simulator import observe_file
from grader.frontends import batch
from grader.frontends import progress as progress_line
from grader.frontends.reports import class_report
from grader.frontends.batch.verdict import printable, verdict
from grader.frontends.notebooks.file import build_notebook
from grader.frontends.batch.runner import record_bytes
from grader.frontends.targets import REPO
from grader.specs import SPECS

ROOT = REPO

HANG = "import time\n\ndef data_parallel_step(dist, x_shard, target_shard, layers, lr):\n    time.sleep(600)\n"
HOG = ("import torch\n\ndef data_parallel_step(dist, x_shard, target_shard, layers, lr):\n"
       "    hog = torch.empty(2**36, dtype=torch.float64)\n")
CRASH = "os = getattr(print.__self__, '__imp' + 'ort__')('os')\nprint('garbage ' * 1000)\nos._exit(3)\n"
MISTYPED = "from puzzles.model import forward, los_fn\n"  # an ImportError that names the grader's own file
GARBAGE = ("print('\\x00\\xff garbage', flush=True)\n\ndef data_parallel_step(dist, x_shard, target_shard, layers, lr):\n"
           "    for w1, w2 in layers:\n        w1.data = object()\n")


def test_batch_grades_a_class_and_survives_bad_submissions(tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copytree(ROOT / "solutions", subs / "alice")
    shutil.copytree(ROOT / "tests" / "naive", subs / "bob")
    nbformat.write(build_notebook(ROOT, solved=True), str(subs / "carol.ipynb"))
    nbformat.write(build_notebook(ROOT, solved=False), str(subs / "cora.ipynb"))
    spaced = build_notebook(ROOT, solved=True)  # a line of a megabyte of spaces: the parent once read it for hours
    cell = next(c for c in spaced.cells if "p3" in c.get("metadata", {}).get("tags", []))
    cell.source += "\n" + " " * 1_000_000 + "\n"
    nbformat.write(spaced, str(subs / "spaced.ipynb"))
    for name, source in (("dave", HANG), ("erin", HOG), ("frank", CRASH), ("gina", GARBAGE), ("hank", MISTYPED)):
        (subs / name).mkdir()
        (subs / name / "p3_data_parallel.py").write_text(source)
    (subs / "notes.txt").write_text("not a submission")
    (subs / "broken.ipynb").write_text('{"cells": [')
    progress = io.StringIO()
    monkeypatch.setattr(progress_line, "on_a_terminal", lambda stream: stream is progress)  # a person watches
    # 30 s a puzzle: generous for the honest ones on a busy machine (10 s once proved too short for naive p3);
    # dave, the deliberate hang, uses it up on one job while the other grades the rest.
    rows = batch.run_batch(subs, 4, 30, 3000, ["p3"], jobs=2, progress=progress)

    assert [r["name"] for r in rows] == sorted(p.name for p in subs.iterdir())  # one row per item, folder order
    assert all(set(r) == {"name", "kind", "error", "puzzles", "seconds", "flags", "graded", "note", "items"}
               for r in rows)
    by = {r["name"]: r for r in rows}
    assert {n: r["kind"] for n, r in by.items() if r["kind"] != "folder"} == {
        "carol.ipynb": "notebook", "cora.ipynb": "notebook", "spaced.ipynb": "notebook", "notes.txt": "stray",
        "broken.ipynb": "broken"}
    assert by["notes.txt"]["error"].startswith("not a submission") and by["notes.txt"]["puzzles"] == []
    assert by["broken.ipynb"]["error"].startswith("could not read the notebook: ")
    assert "\n" not in by["broken.ipynb"]["error"] and "Traceback" not in by["broken.ipynb"]["error"]
    p3 = {n: r["puzzles"][0] for n, r in by.items() if r["puzzles"]}
    assert {n: p.status for n, p in p3.items()} == {
        "alice": "pass", "bob": "fail", "carol.ipynb": "pass", "cora.ipynb": "not_attempted",
        "spaced.ipynb": "pass", "dave": "error",
        "erin": "error", "frank": "error", "gina": "error", "hank": "error"}
    assert p3["dave"].error.startswith("stopped after 30 s: an endless loop, or a wait that never ends?")
    assert p3["erin"].error.startswith("ran out of memory (the limit is 3000 MiB") and "allocate" in p3["erin"].error
    assert "exit status 3" in p3["frank"].error and "garbage garbage" in p3["frank"].error
    assert "cannot import name 'los_fn' from 'puzzles.model' (puzzles/model.py)" in p3["hank"].error, p3["hank"].error
    assert str(ROOT) not in p3["hank"].error and "/submission" not in p3["hank"].error  # no path of this machine
    assert by["alice"]["graded"] == f"its top ({len(SPECS)} puzzle files)"
    assert by["carol.ipynb"]["graded"] == "carol.ipynb"
    assert all(r["error"] == "" for n, r in by.items() if r["kind"] in ("folder", "notebook"))
    log = progress.getvalue()
    assert "[12/12]" in log  # a line per submission, as it goes
    assert "\r6/12 submissions graded  [" in log and log.endswith("\r" + progress_line.ERASE)  # a line, then erased
    assert re.findall(r"\r\x1b\[K\[(\d+)/12\] [^\r]*\n", log) == [str(i) for i in range(1, 13)]  # each whole

    out, js = tmp_path / "results.csv", tmp_path / "results.json"
    class_report.write_reports(rows, 4, ["p3"], csv_path=out, json_path=js)
    table = {r["submission"]: r for r in csv.DictReader(out.open())}
    assert table["alice"]["p3"] == "pass" and table["alice"]["passed"] == "1"
    assert table["notes.txt"]["p3"] == "not_graded" and table["notes.txt"]["error"].startswith("not a submission")
    data = {s["name"]: s for s in json.loads(js.read_text())["submissions"]}
    assert data["broken.ipynb"]["kind"] == "broken" and data["gina"]["puzzles"][0]["status"] == "error"


def test_an_error_names_no_folder_of_the_grading_machine():
    from grader.backends.learner_code import without_machine_paths

    site = "/opt/venvs/course/lib/python3.11/site-packages"
    said = (f"cannot import name 'x' from 'puzzles.model' ({ROOT}/puzzles/model.py); "
            f"No module named 'y' ({site}/torch/__init__.py); open('/submission/data.bin') in /submission/p3.py")
    assert without_machine_paths(said, "/submission/p3.py") == (
        "cannot import name 'x' from 'puzzles.model' (puzzles/model.py); No module named 'y' (torch/__init__.py); "
        "open('data.bin') in p3.py")
    assert without_machine_paths("/etc/passwd", "/p3.py") == "/etc/passwd"  # a file at the root keeps its path


def test_a_submission_time_limit_caps_its_puzzles_and_says_so(tmp_path):
    """--submission-timeout: the puzzles share it; the one that runs into it says whose limit stopped it, and
    those left are errors that say why, instead of Gradescope stopping the whole run with no results."""
    subs = tmp_path / "subs"
    (subs / "dave").mkdir(parents=True)
    (subs / "dave" / "p3_data_parallel.py").write_text(HANG)
    shutil.copy(ROOT / "solutions" / "p1_checkpointing.py", subs / "dave")
    [row] = batch.run_batch(subs, 4, 60, 3000, ["p3", "p1"], jobs=1, progress=io.StringIO(), submission_timeout=3)
    p3, p1 = row["puzzles"]
    assert p3.status == "error" and p3.error.startswith("stopped after 3.0 s, what was left of the submission's time "
                                                        "limit of 3 s")
    assert p1.status == "error" and "the submission's time limit of 3 s ran out before this puzzle" in p1.error
    assert row["seconds"] < 30


# ---- the parent's checks, without a sandbox: a record is evidence, never a verdict


def _record(spec_id: str, folder: Path, seed: int = 3) -> tuple:
    spec = SPECS[spec_id]
    observed = observe_file(spec, folder / spec.filename, spec.make_inputs(seed), seed)
    return spec, {"status": "observed", "observation": asdict(observed), "findings": []}


def _framed(record) -> bytes:
    return record_bytes(record)


def _verdict(spec, payload, seed=3):
    reply = {"puzzle": spec.id, "timed_out": False, "exit": 0, "signal": None, "too_big": False, "jailed": True,
             "output": ""}
    return verdict(spec, reply, payload, seed, 10, 1000)


def test_the_parent_grades_an_honest_record_as_the_simulator_would():
    spec, record = _record("p3", ROOT / "solutions")
    result, flags = _verdict(spec, _framed(record))
    assert result.status == "pass" and flags == []


def test_a_record_cannot_claim_the_real_backend_to_skip_the_clock_checks():
    spec, record = _record("p7", ROOT / "tests" / "naive")
    record["observation"]["backend"] = "torch"  # would turn the makespan check into "simulator only"
    result, _ = _verdict(spec, _framed(record))
    assert result.status == "fail" and "makespan" in [c.name for c in result.failed_checks()]


def test_a_second_record_on_the_pipe_is_refused():
    spec, record = _record("p3", ROOT / "solutions")
    result, flags = _verdict(spec, _framed(record) + _framed(record))
    assert result.status == "error" and "bytes beyond what the header declares" in result.error and flags


def test_a_record_that_is_not_plain_data_is_refused():
    spec = SPECS["p3"]
    buffer = io.BytesIO()
    torch.save({"status": "observed", "findings": [], "observation": Path("/")}, buffer)  # a pickle
    result, _ = _verdict(spec, buffer.getvalue())
    assert result.status == "error" and "(not a record)" in result.error


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_refused():
    data = record_bytes({"status": "observed", "findings": [], "observation": torch.ones(4, dtype=torch.float64)})
    forged = data.replace(b'"shape": [4]', b'"shape": [8]')  # would read past its bytes
    result, _ = _verdict(SPECS["p3"], forged)
    assert result.status == "error" and "do not match its shape [8]" in result.error, result.error


def test_a_record_names_no_code():
    with pytest.raises(TypeError):
        record_bytes({"status": "observed", "findings": [], "observation": [lambda: 0]})


def test_a_peak_that_disagrees_with_its_own_timeline_is_refused():
    spec, record = _record("p1", ROOT / "tests" / "naive")
    record["observation"]["peak_bytes"][0] = record["observation"]["ledgers"][0]["peak"] = 8
    result, flags = _verdict(spec, _framed(record))
    assert result.status == "error" and "disagrees with its own timeline" in result.error, result.error
    assert flags == ["p1: malformed record (rank 0's peak (8) disagrees with its own timeline)"]


def test_findings_make_the_puzzle_an_error_and_go_to_the_flags():
    spec, record = _record("p3", ROOT / "solutions")
    record["findings"] = ["grader.core.grading.grade_observation was replaced"]
    result, flags = _verdict(spec, _framed(record))
    assert result.status == "tampered" and "tampering" in result.error
    assert flags == ["p3: tampering: grader.core.grading.grade_observation was replaced"]


def test_a_record_cannot_claim_a_grader_failure():
    """Only the parent decides a grader failure: "not your answer's fault" is not the puzzle's process's to say."""
    data = record_bytes({"status": "grader_error", "findings": [], "error": "the grader crashed, not your fault"})
    result, flags = _verdict(SPECS["p3"], data)
    assert result.status == "error" and "malformed record (no status)" in result.error, result.error
    assert flags == ["p3: malformed record (no status)"]


def test_an_exit_status_after_the_jail_is_entered_is_the_learners():
    spec = SPECS["p3"]
    reply = {"puzzle": "p3", "timed_out": False, "exit": 70, "signal": None, "too_big": False, "output": ""}
    result, flags = verdict(spec, {**reply, "jailed": True}, b"", 3, 10, 1000)
    assert result.status == "error" and "exit status 70" in result.error and "sandbox" not in result.error
    assert flags == []
    result, flags = verdict(spec, {**reply, "jailed": False}, b"", 3, 10, 1000)  # ended before the jail was entered
    assert "the sandbox could not be entered (a grader failure" in result.error and flags


def test_a_record_is_made_without_running_any_of_the_learners_code(monkeypatch):
    """record.dumps calls no method of a learner's class (a dict whose items() lies, a str whose __str__ lies, a
    tensor subclass is refused), and json changed after the grader was imported does not reach it."""
    import json.encoder

    class Lying(dict):
        def items(self):
            raise AssertionError("the learner's items() ran")

    class Shout(str):
        def __str__(self):
            raise AssertionError("the learner's __str__ ran")

    honest = record_bytes({"a": [1, 2.5, "x"], "t": torch.arange(3.0)})
    monkeypatch.setattr(json, "dumps", lambda *a, **k: '{"forged": 1}')
    monkeypatch.setattr(json.encoder.JSONEncoder, "iterencode", lambda *a, **k: iter(['{"forged": 1}']))
    assert record_bytes({"a": [1, 2.5, "x"], "t": torch.arange(3.0)}) == honest
    assert record_bytes(Lying(a=Shout("b"))) == record_bytes({"a": "b"})
    with pytest.raises(TypeError, match="a Sub"):
        record_bytes({"t": torch.ones(2).as_subclass(type("Sub", (torch.Tensor,), {}))})


def test_text_from_a_learner_is_escaped_and_bounded():
    assert printable("ok\n\tline\x1b[2J\r\x07") == "ok\n\tline\\x1b[2J\\r\\x07"
    assert len(printable("x" * 10_000, 100)) < 150


def test_a_notebook_is_read_in_a_process_of_its_own_within_a_limit(tmp_path):
    """The parent never reads a notebook itself: a worker's child does, killed at its time limit (here 0 s, so that
    the limit is reached whatever the machine), and says why."""
    from grader.frontends.batch.zygote import read_notebook

    nbformat.write(build_notebook(ROOT, solved=True), str(tmp_path / "carol.ipynb"))
    (tmp_path / "copy").mkdir()
    # A process this one had before is not the reader's to kill (run outside a zygote, the reader's clean-up once
    # killed this test process's multiprocessing forkserver, and every later gloo test of the process failed).
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        said = read_notebook({"notebook": str(tmp_path / "carol.ipynb"), "into": str(tmp_path / "copy"),
                              "timeout": 60})
        assert said == {"error": ""} and (tmp_path / "copy" / "p3_data_parallel.py").is_file()
        (tmp_path / "late").mkdir()
        said = read_notebook({"notebook": str(tmp_path / "carol.ipynb"), "into": str(tmp_path / "late"), "timeout": 0})
        assert said == {"error": "could not read the notebook within 0 s"}, said
        assert before.poll() is None, f"the reader's clean-up killed a process it did not start ({before.returncode})"
    finally:
        before.kill()
        before.wait()


def test_a_private_copy_takes_regular_py_files_and_never_follows_links(tmp_path):
    sub = tmp_path / "mallory"
    sub.mkdir()
    (sub / "p3_data_parallel.py").write_text("x = 1\n")
    (sub / "p1_checkpointing.py").symlink_to(ROOT / "solutions" / "p1_checkpointing.py")
    (sub / "notes.md").write_text("not code")
    flags = batch.private_copy(sub, "folder", tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["p3_data_parallel.py"]
    assert flags == ["ignored the symbolic link p1_checkpointing.py"]
