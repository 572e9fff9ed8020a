"""The sandbox's weaker modes, forced with `--sandbox`: what a non-root instructor (userns) and a machine without
namespaces (process: macOS, a locked-down container) still get. Each mode grades a small class on p3 with a
30-second limit, generous for the honest puzzles on a busy machine; the looper, the deliberate endless loop, uses
it up on one job while the other grades the rest.
"""

from __future__ import annotations

import io
import secrets

import pytest
from batch_attacks import attack_class, daemon, killer, solution, survivors

from grader.frontends import batch

LIMIT = 30  # seconds per puzzle
# Each mode's class holds an endless loop that uses up its 30 s: the whole file is `slow` (`pytest tests -m slow`,
# CI's second step); the default mode's guarantees run in `pytest tests` (test_batch_sandbox.py).
pytestmark = pytest.mark.slow


def _class(tmp_path, marker):
    subs = tmp_path / "subs"
    attacks = attack_class(subs, [tmp_path / "results.csv"], marker)
    files = {"alice": solution("p3"), "reader": attacks["mallory_solutions"]["p3"],
             "daemon": daemon(marker, "pass") + solution("p3"),
             "looper": attacks["looper"]["p3"], "exiter": attacks["exit_rank"]["p3"],
             "killer": killer(marker) + solution("p3"), "zalice": solution("p3")}
    for name, source in files.items():
        (subs / name).mkdir(parents=True)
        (subs / name / "p3_data_parallel.py").write_text(source)
    return subs


def _grade(tmp_path, mode):
    marker = "sbx" + secrets.token_hex(4)
    progress = io.StringIO()
    try:
        rows = batch.run_batch(_class(tmp_path, marker), 5, LIMIT, 2000, ["p3"], jobs=2, progress=progress,
                               sandbox_mode=mode)
    except RuntimeError as exc:
        if "unavailable" in str(exc):
            pytest.skip(f"{mode} is not available here: {exc}")
        raise
    alive = survivors(marker)
    return {r["name"]: r["puzzles"][0] for r in rows}, progress.getvalue(), alive


def _common(p3, alive):
    assert alive == []  # the daemons are dead when the batch returns, the one that killed its warden and zygote too
    assert p3["alice"].status == "pass"
    assert p3["daemon"].status == "tampered"  # it lifted the rank's rules to start its daemon (batch_attacks.py)
    assert p3["zalice"].status == "pass"  # graded after the killer, by a worker started afresh if it had to be
    assert p3["looper"].status == "error" and p3["looper"].error.startswith(f"stopped after {LIMIT} s")
    assert p3["exiter"].status == "error" and "sys.exit(0)" in p3["exiter"].error


def test_userns_mode_isolates_without_root(tmp_path):
    p3, said, alive = _grade(tmp_path, "userns")
    assert said.startswith("sandbox: userns (each puzzle in its own user, mount, PID, network")
    _common(p3, alive)
    assert p3["reader"].status == "error" and "ATTACK FOUND NO SOLUTIONS" in p3["reader"].error


def test_process_mode_says_it_does_not_isolate_files_and_still_kills_and_limits(tmp_path):
    p3, said, alive = _grade(tmp_path, "process")
    assert said.startswith("sandbox: process (") and "NO file isolation" in said
    _common(p3, alive)  # the reader may find the solutions here: that is what "NO file isolation" says
