"""The batch sandbox's threat model, held by adversarial submissions (tests/batch_attacks.py): each tries to break
one guarantee, and each test says which guarantee and how it must fail.

One class of 23 submissions, graded once by `python -m grader batch` on four puzzles (p1, p3, p4, p7; a submission
hands in the puzzles it attacks, and the witnesses of "costs that puzzle only" the references too) with a
30-second limit per puzzle and two jobs. The limit is generous on purpose: every honest puzzle must finish
within it on a busy machine (an honest puzzle takes under a second when the machine is quiet, and 10 s once
proved too short under load); only the looper, the deliberate endless loop, uses it up, on one of the two jobs
while the other grades on. The guarantees that need the operating system's isolation are asserted in the mode
this machine gives (namespaces as root, userns otherwise); in the degraded `process` mode they are skipped, and
tests/test_batch_modes.py shows what that mode still holds.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import subprocess
import sys
import time

import pytest
from batch_attacks import PUZZLES, survivors, write_class

from grader.frontends.targets import REPO

pytestmark = pytest.mark.xdist_group("batch_sandbox")  # one xdist worker: its module-scoped batch run

TIMEOUT = 30


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sandbox")
    subs, out, js = tmp / "subs", tmp / "results.csv", tmp / "results.json"
    marker = "sbx" + secrets.token_hex(4)
    attacks = write_class(subs, [out, js], marker)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grader", "batch", str(subs), "--out", str(out), "--json", str(js),
                           "--puzzle-timeout", str(TIMEOUT), "--memory-mb", "2000", "--seed", "7", "--jobs", "2",
                           *(f"-p{p}" for p in PUZZLES)], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, INSTRUCTORS_SECRET_TOKEN="hunter2"), check=False)
    wall = time.monotonic() - started
    alive = survivors(marker)  # at once: nothing may outlive the batch
    assert proc.returncode == 0, proc.stderr
    rows = {s["name"]: s for s in json.loads(js.read_text())["submissions"]}
    puzzles = {name: {p["id"]: p for p in row["puzzles"]} for name, row in rows.items()}
    mode = next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("sandbox:"))
    return dict(rows=rows, puzzles=puzzles, stderr=proc.stdout + proc.stderr, alive=alive, wall=wall, subs=subs,
                out=out, js=js, mode=mode, attacks=attacks, tmp=tmp)


@pytest.fixture
def isolated(graded):
    if graded["mode"] == "process":
        pytest.skip("this machine allows no namespaces: batch runs in 'process' mode, without file isolation")
    return graded


def status(graded, name, pid):
    return graded["puzzles"][name][pid]["status"]


def error(graded, name, pid):
    return graded["puzzles"][name][pid].get("error", "")


def lifted(graded, name, pid):
    """The attacks on the sandbox lift the rank's rules first (batch_attacks.LIFT_THE_RULES): the puzzle that did
    is not graded, and says why; the sandbox's own guarantee is what the test then asserts."""
    assert status(graded, name, pid) == "tampered", error(graded, name, pid)
    assert "puzzles.simulator.escapes.HANDLERS was modified" in error(graded, name, pid), error(graded, name, pid)


def test_honest_submissions_are_graded_as_usual(graded):
    assert all(status(graded, "alice", p) == "pass" for p in PUZZLES), graded["puzzles"]["alice"]
    assert status(graded, "tempfile_user", "p3") == "pass", error(graded, "tempfile_user", "p3")  # its own /tmp
    assert all(status(graded, "bob", p) == "fail" for p in PUZZLES), graded["puzzles"]["bob"]
    assert all(row["kind"] == "folder" and row["error"] == "" for row in graded["rows"].values())


def test_nothing_outlives_the_batch(graded):
    """Daemons (double fork + setsid, one of them exec'd), a grandchild holding stderr: all dead when batch exits."""
    assert graded["alive"] == []


def test_a_submission_cannot_read_or_delete_other_submissions(isolated):
    assert (isolated["subs"] / "alice" / "p1_checkpointing.py").exists()
    assert (isolated["subs"] / "bob" / "p1_checkpointing.py").exists()
    assert status(isolated, "mallory_delete", "p1") == "pass", error(isolated, "mallory_delete", "p1")  # saw nothing


def test_a_submission_cannot_read_the_reference_solutions(isolated):
    assert status(isolated, "mallory_solutions", "p3") == "error"
    assert "ATTACK FOUND NO SOLUTIONS" in error(isolated, "mallory_solutions", "p3")


def test_a_forged_observation_file_is_neither_written_nor_read(isolated):
    assert not (isolated["tmp"] / "grade-decoy").exists()
    lifted(isolated, "mallory_forge", "p3")  # (its forged file would have said "pass")


def test_a_daemon_cannot_rewrite_the_results(isolated):
    rows = {r["submission"]: r for r in csv.DictReader(isolated["out"].open())}
    assert set(rows) == set(isolated["attacks"]) and rows["bob"]["passed"] == "0"
    lifted(isolated, "mallory_daemon", "p4")  # its own puzzle: the rules it lifted are seen


def test_a_grandchild_holding_stderr_cannot_make_the_batch_wait(graded):
    row = graded["rows"]["mallory_stderr"]
    assert row["seconds"] < TIMEOUT, row  # its puzzles did not wait for the grandchild
    lifted(graded, "mallory_stderr", "p1")


def test_every_submission_stays_within_its_own_time_limit(graded):
    for name, row in graded["rows"].items():
        assert row["seconds"] <= len(PUZZLES) * TIMEOUT + 5, (name, row["seconds"])


def test_sys_exit_at_import_costs_that_puzzle_only(graded):
    assert status(graded, "exit_import", "p1") == "error"
    assert "SystemExit" in error(graded, "exit_import", "p1")
    assert [status(graded, "exit_import", p) for p in ("p3", "p4", "p7")] == ["pass"] * 3


def test_sys_exit_and_os_exit_inside_a_rank_cost_that_puzzle_only(graded):
    assert status(graded, "exit_rank", "p3") == "error" and "sys.exit(0)" in error(graded, "exit_rank", "p3")
    assert status(graded, "exit_rank", "p4") == "error"
    assert "exit status 0" in error(graded, "exit_rank", "p4") and "os._exit" in error(graded, "exit_rank", "p4")
    assert [status(graded, "exit_rank", p) for p in ("p1", "p7")] == ["pass"] * 2


def test_an_endless_loop_costs_that_puzzle_only(graded):
    assert status(graded, "looper", "p3") == "error"
    assert error(graded, "looper", "p3").startswith(f"stopped after {TIMEOUT} s: an endless loop")
    assert [status(graded, "looper", p) for p in ("p1", "p4", "p7")] == ["pass"] * 3


def test_a_memory_hog_costs_that_puzzle_only(graded):
    for pid in ("p3", "p4"):
        assert status(graded, "hog", pid) == "error"
        assert error(graded, "hog", pid).startswith("ran out of memory (the limit is 2000 MiB"), error(graded, "hog", pid)
    assert [status(graded, "hog", p) for p in ("p1", "p7")] == ["pass"] * 2


def test_a_learners_output_never_reaches_the_terminal_raw(graded):
    assert "FAKE-PROGRESS" not in graded["stderr"] and "\x1b" not in graded["stderr"]
    said = error(graded, "liar", "p1")
    assert "FAKE-PROGRESS" in said and "\\x1b[2K" in said and "\x1b" not in said, said
    assert "\\x1b[2Jcleared your screen" in said


@pytest.mark.parametrize("name, pid, evidence", [
    ("tamper_checks", "p3", "grader.core.grading.grade_observation was rebound"),
    ("tamper_ledger", "p1", "puzzles.simulator.memory.Ledger.allocate was changed"),
    ("tamper_cost", "p7", "grader.specs.p7_overlap.spec.COST.bytes_per_tick was changed"),
    ("tamper_observe", "p3", "grader.backends.simulator.observe_module was rebound"),
])
def test_patching_the_grader_or_the_simulator_is_flagged_and_never_passes(graded, name, pid, evidence):
    """Each attack names its modules with computed strings, so the static scan for internals does not see it:
    the fingerprint taken around the run (grader/backends/tamper.py) must."""
    assert status(graded, name, pid) == "tampered"
    assert error(graded, name, pid).startswith("your code modified what the grader relies on")
    assert any(evidence in flag for flag in graded["rows"][name]["flags"]), graded["rows"][name]["flags"]


def test_changing_the_ledger_from_inside_the_run_is_caught(graded):
    """The figures are cross-checked: a peak that disagrees with the ledger's own timeline is not a measurement
    (the ledger's audit in the child; the parent checks the record again, test_batch.py)."""
    assert status(graded, "tamper_world", "p1") == "tampered"
    assert "not the highest point of its own timeline" in error(graded, "tamper_world", "p1")
    assert any("tampering" in flag for flag in graded["rows"]["tamper_world"]["flags"])


@pytest.mark.parametrize("pid, evidence", [
    ("p7", "os.write was rebound"),  # rewrites its record's bytes as they leave
    ("p3", "a hook was installed with sys.setprofile"),  # rewrites the record as it is handed to the encoder
    ("p4", "aten::max: a CPU kernel registered at p4_tensor_parallel.py"),  # every max reads 0
])
def test_a_record_rewritten_on_its_way_out_is_flagged_and_never_passes(graded, pid, evidence):
    """Each forger names no grader internal (README, "What a determined learner can still do"): the record leaves
    through code bound before the learner's code ran, the hooks are cleared before it is made, and the fingerprint
    watches os, sys, json and the dispatcher's kernels."""
    assert status(graded, "forger", pid) == "tampered", error(graded, "forger", pid)
    assert any(evidence in flag for flag in graded["rows"]["forger"]["flags"]), graded["rows"]["forger"]["flags"]


def test_a_thread_still_running_as_the_record_is_made_is_flagged(graded):
    assert status(graded, "lingerer", "p3") == "tampered", error(graded, "lingerer", "p3")
    assert "thread(s) of the answer's were still running when its record was made" in error(graded, "lingerer", "p3")


def test_a_thread_started_without_lifting_the_rules_is_refused_where_it_starts(graded):
    """The sandbox's attacks lift the rank's rules first (batch_attacks.LIFT_THE_RULES); without that, the rules
    alone refuse the lingerer's thread at its line."""
    assert status(graded, "starter", "p3") == "error"
    said = error(graded, "starter", "p3")
    assert "rank 0 started a thread (threading.Thread.start) at p3_data_parallel.py:2" in said, said
    assert [status(graded, "starter", p) for p in ("p1", "p4", "p7")] == ["pass"] * 3


def test_only_the_parent_decides_a_grader_failure(graded):
    """A record that claims "grader_error" is malformed; and once the jail is entered, an exit status (70 was the
    sandbox's own) is the learner's."""
    assert status(graded, "forger", "p1") == "error" and "malformed record (no status)" in error(graded, "forger", "p1")
    assert status(graded, "exit70", "p1") == "error"
    assert "exit status 70" in error(graded, "exit70", "p1") and "sandbox" not in error(graded, "exit70", "p1")
    assert not any("grader failure" in f for f in graded["rows"]["exit70"]["flags"])


def test_a_submission_sees_none_of_the_instructors_environment(graded):
    said = error(graded, "env_reader", "p3")
    assert said.startswith("p3_data_parallel.py could not be imported: RuntimeError: ENV ") and "PATH" in said
    assert "INSTRUCTORS_SECRET_TOKEN" not in said
