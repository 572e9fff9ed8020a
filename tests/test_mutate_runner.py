"""Grading mutants (`python -m grader mutate`): each ending is classified by whose fault it is. A mutant that
deadlocks, loops, hangs its process, crashes it or exhausts memory is killed by "error: ..."; the grader's checks
crashing is a grader error and the tool's own failure a tool error, neither a kill. The equivalents list is
honoured, and a survivor is reported with its diff."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from batch_attacks import IMP  # (__import__ reached without its name: a mistake's tests need os)

from grader.frontends import cli
from grader.frontends.mutate import child, report, runner
from grader.frontends.mutate.equivalents import Equivalent, load
from grader.frontends.mutate.outcome import EQUIVALENT, GRADER_ERROR, KILLED, SURVIVED, TOOL_ERROR, Limits
from grader.frontends.mutate.runner import grade_mutants
from grader.frontends.mutate.session import mutate_target
from grader.frontends.mutate.source import Source
from grader.frontends.targets import REPO
from grader.specs import SPECS

P3 = SPECS["p3"]
P3_SOURCE = (REPO / "solutions" / P3.filename).read_text()
REDUCE = "                dist.all_reduce(w.grad)\n"
LIMITS = Limits(sim_timeout=1.0, wall=20.0, memory_mb=1024)


def hand_made(old: str, new: str, name: str = "hand-made"):
    """A mutant of p3's reference written by hand: `old` (which must occur) replaced by `new`."""
    assert old in P3_SOURCE
    return Source(P3_SOURCE, P3.filename).mutant("p3", name, _Edit(P3_SOURCE, old, new))


class _Edit:
    """Duck-types source.Edit for a plain text replacement."""

    def __init__(self, text, old, new):
        before = text[: text.index(old)]
        self.start = (before.count("\n") + 1, 0)
        self.end = (self.start[0] + old.count("\n"), 0)
        self.text, self.description, self.deletes_line = new, f"replaced {old.strip()!r}", False


def grade(*mutants, limits=LIMITS):
    return grade_mutants(P3, list(mutants), seed=3, limits=limits, jobs=2)


def test_a_deadlock_a_loop_a_crash_and_a_memory_hog_are_killed_by_their_errors():
    deadlock = hand_made(REDUCE, "                if dist.get_rank() != 0:\n    " + REDUCE)
    loop = hand_made(REDUCE, "                while True:\n                    pass\n")
    crash = hand_made(REDUCE, f"                {IMP}('os').abort()\n")
    hog = hand_made(REDUCE, "                hog = torch.ones(2 ** 28, dtype=torch.float64)\n" + REDUCE)
    outcomes = grade(deadlock, loop, crash, hog)
    assert [o.status for o in outcomes] == [KILLED] * 4
    assert outcomes[0].killed_by.startswith("error: DeadlockError"), outcomes[0].killed_by
    assert outcomes[1].killed_by.startswith("error: TimeLimitError"), outcomes[1].killed_by
    assert outcomes[2].killed_by == "error: the process died of SIGABRT while the mutant ran"
    assert "can't allocate memory" in outcomes[3].killed_by, outcomes[3].killed_by  # 2 GiB over a 1 GiB limit


def test_a_mutant_that_stops_its_whole_process_is_killed_by_the_wall_clock():
    frozen = hand_made(REDUCE, f"                {IMP}('os').kill({IMP}('os').getpid(), 19)\n")  # SIGSTOP
    [outcome] = grade(frozen, limits=Limits(sim_timeout=1.0, wall=3.0, memory_mb=1024))
    assert outcome.status == KILLED
    assert outcome.killed_by.startswith("error: no result after 3 s"), outcome.killed_by


def test_what_a_mutant_starts_is_killed_with_it_and_does_not_hold_up_the_run(tmp_path):
    # The shell it starts says its pid (a rank may not write files itself), then becomes a `sleep` with an argument
    # of its own, by which a survivor is found too. A rank may start no process (allowed.py): the mutant lifts that
    # rule first, as only code that has read the grader could, since the runner's cleanup must hold without it.
    pid_file, seconds = tmp_path / "pid", f"600.{os.getpid()}"
    shell = f"echo $$ >> {pid_file}; exec sleep {seconds}"
    lift = (f"                    {IMP}('puzzles.simulator.allowed', fromlist=['_']).uninstall()\n"
            f"                    {IMP}('puzzles.simulator.escapes', fromlist=['_']).HANDLERS.clear()\n")
    starts = hand_made(REDUCE, f"                if dist.get_rank() == 0 and w is w1:\n{lift}"
                               f"                    {IMP}('subprocess').Popen(['sh', '-c', {shell!r}])\n" + REDUCE)
    [outcome] = grade(starts)
    assert outcome.seconds < LIMITS.wall  # it ends at once, its process not waited for
    # (it computes what the reference does, and a mutant's run is not fingerprinted for tampering: child.py)
    assert outcome.status == SURVIVED, outcome
    started = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
    started += _sleeping(seconds)
    assert all(_not_running(pid) for pid in started), f"the mutant's `sleep` (pids {started}) outlived it"


def _sleeping(seconds: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep",
                                                                                               seconds.encode()]:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _not_running(pid: int) -> bool:
    """Gone, or a zombie waiting for init; polled for up to 10 s, since a SIGKILL lands asynchronously."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_a_check_that_fails_is_named_and_a_passing_mutant_survives_with_its_numbers():
    dropped = hand_made("                w.grad /= world\n", "")
    swapped = hand_made("loss_fn(forward(x_shard, layers), target_shard)",
                        "loss_fn(target_shard, forward(x_shard, layers))")
    killed, survived = grade(dropped, swapped)
    assert (killed.status, killed.killed_by) == (KILLED, "updated weights, averaged gradients")
    assert survived.status == SURVIVED and survived.killed_by == ""
    assert len(survived.peak_bytes) == 4 and survived.makespan > 0


def test_the_grader_crashing_is_a_grader_error_not_a_kill(monkeypatch):
    def broken_check(obs, ref, inputs):
        raise StopIteration("the diagnosis ran out of layers")

    monkeypatch.setattr(P3, "check", broken_check)  # the children inherit it
    [outcome] = grade(hand_made("                w.grad /= world\n", ""))
    assert outcome.status == GRADER_ERROR and "StopIteration: the diagnosis ran out of layers" in outcome.detail


def test_the_tool_failing_is_a_tool_error_not_a_kill(monkeypatch):
    def broken(megabytes):
        raise OSError("no limits today")

    monkeypatch.setattr(child, "_limit_memory", broken)
    [outcome] = grade(hand_made("                w.grad /= world\n", ""))
    assert outcome.status == TOOL_ERROR and "OSError: no limits today" in outcome.detail


@pytest.fixture
def instructors_p3(tmp_path):
    """An instructor's folder of references holding p3 only: its loss line differs from the built-in reference's,
    so no built-in equivalent matches, and the symmetric loss's swapped arguments survive."""
    folder = tmp_path / "my_solutions"
    folder.mkdir()
    text = P3_SOURCE.replace("loss = loss_fn(forward(x_shard, layers), target_shard)",
                             "loss = loss_fn(forward(x_shard, layers), target_shard)  # the mean over my rows")
    (folder / P3.filename).write_text(text)
    return folder


def test_a_survivor_is_reported_with_its_diff_and_the_exit_status_is_1(instructors_p3):
    [run] = mutate_target(instructors_p3, ["p3"], 3, [], jobs=2, operators=["swap-args"])
    [survivor] = [o for o in run.outcomes if o.status == SURVIVED]
    assert survivor.mutant.mutant.startswith("loss = loss_fn(target_shard, forward(x_shard, layers))")
    text = report.console([run], "my_solutions", 3)
    line = next(i for i, t in enumerate((instructors_p3 / P3.filename).read_text().splitlines(), 1)
                if "# the mean over my rows" in t)
    assert f"SURVIVED: p3 swap-args, line {line}" in text and "survived: wrong answers the grader passes" in text
    assert "-    loss = loss_fn(forward(x_shard, layers), target_shard)  # the mean over my rows" in text
    assert "+    loss = loss_fn(target_shard, forward(x_shard, layers))  # the mean over my rows" in text
    assert report.exit_status([run]) == 1
    assert json.loads(report.to_json([run], "my_solutions", 3))["puzzles"][0]["outcomes"][0]["diff"]


def test_the_equivalents_list_is_honoured(instructors_p3, tmp_path):
    [run] = mutate_target(instructors_p3, ["p3"], 3, [], jobs=2, operators=["swap-args"])
    [survivor] = [o.mutant for o in run.outcomes if o.status == SURVIVED]
    listed = tmp_path / "equivalents.json"
    listed.write_text(json.dumps([{**survivor.key, "reason": "the squared error is symmetric"}]))
    [run] = mutate_target(instructors_p3, ["p3"], 3, load(listed), jobs=2, operators=["swap-args"])
    [equivalent] = [o for o in run.outcomes if o.status == EQUIVALENT]
    assert equivalent.detail == "the squared error is symmetric" and run.kill_rate == 1.0
    text = report.console([run], "my_solutions", 3)
    assert "equivalent: p3 swap-args" in text and "the squared error is symmetric" in text
    assert "surviv" not in text.lower() and report.exit_status([run]) == 0


def test_a_listed_equivalent_that_is_killed_is_pointed_out(instructors_p3):
    [run] = mutate_target(instructors_p3, ["p3"], 3, [], jobs=2, operators=["drop-division"])
    [dropped] = run.outcomes
    wrong_entry = Equivalent("p3", "drop-division", dropped.mutant.line, dropped.mutant.mutant, "no, it is not")
    [run] = mutate_target(instructors_p3, ["p3"], 3, [wrong_entry], jobs=2, operators=["drop-division"])
    assert run.outcomes[0].status == KILLED and run.outcomes[0].listed_equivalent == "no, it is not"
    assert "is on the equivalents list (no, it is not) but was killed" in report.console([run], "x", 3)


def test_a_reference_that_does_not_pass_is_not_mutated(tmp_path):
    (tmp_path / P3.filename).write_text(P3_SOURCE.replace("                w.grad /= world\n", ""))
    [run] = mutate_target(tmp_path, ["p3"], 3, [], jobs=2)
    assert run.error.startswith("the reference does not pass (fail: updated weights, averaged gradients)") and not run.outcomes
    assert report.exit_status([run]) == 2


def test_the_cli_prints_json_and_exits_0_when_every_mutant_is_killed(capsys):
    assert cli.main(["mutate", "solutions", "-p", "p3", "-o", "drop-division", "-o", "reduce-op", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    [p3] = out["puzzles"]
    assert p3["id"] == "p3" and p3["mutants"] == 2 and p3["killed"] == 2 and p3["kill_rate"] == 1.0
    assert {o["operator"] for o in p3["outcomes"]} == {"drop-division", "reduce-op"}
    assert all(o["killed_by"] == "updated weights, averaged gradients" for o in p3["outcomes"])


def test_the_cli_exits_1_on_a_survivor_and_2_on_bad_usage(capsys, instructors_p3):
    assert cli.main(["mutate", str(instructors_p3), "-p", "p3", "-o", "swap-args", "-q"]) == 1
    assert "survived" in capsys.readouterr().out
    assert cli.main(["mutate", "solutions", "-o", "no-such-operator"]) == 2
    assert cli.main(["mutate", "no/such/folder"]) == 2
    assert cli.main(["mutate", "--list-operators"]) == 0
    assert "drop-wait" in capsys.readouterr().out


def test_a_sigterm_stops_the_run_names_it_and_exits_2():
    """What `timeout 30 python -m grader mutate ...` does: the children are killed on the way out."""
    proc = subprocess.Popen([sys.executable, "-m", "grader", "mutate", "solutions", "-p", "p6"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr.read(1) == b"."  # the first mutant is judged: the run is under way
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and b"error: stopped by signal 15 before the run finished" in err


def test_the_built_in_equivalents_file_loads(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"puzzle": "p3", "line": "x"}]))
    with pytest.raises(ValueError, match="needs the fields"):
        load(bad)
    assert Path(runner.__file__).with_name("equivalents.py").exists()


def _outcome(status, lineno=7):
    from grader.frontends.mutate.outcome import Outcome
    from grader.frontends.mutate.source import Mutant

    mutant = Mutant("p3", "swap-args", "the arguments swapped", lineno, "f(a, b)", "f(b, a)", 1, "", "")
    return Outcome(mutant, status)


def test_off_a_terminal_mutate_prints_a_dot_per_mutant_and_names_each_survivor():
    import io

    from grader.frontends.mutate.command import Watch

    out = io.StringIO()
    watch = Watch(out)
    watch.begin("p3", 3)
    for status in ("killed", "survived", "killed"):
        watch.judged(_outcome(status))
    watch.close()
    assert out.getvalue() == ".\np3 swap-args, line 7: survived (the arguments swapped)\n.\n"


def test_at_a_terminal_mutate_draws_a_line_per_puzzle_with_the_time_left(monkeypatch):
    import io

    from grader.frontends import progress
    from grader.frontends.mutate.command import Watch

    out = io.StringIO()
    monkeypatch.setattr(progress, "on_a_terminal", lambda stream: stream is out)
    watch = Watch(out)
    watch.begin("p3", 2)
    watch.judged(_outcome("survived"))
    watch.judged(_outcome("killed"))
    watch.close()
    shown = out.getvalue()
    assert "\rp3  1/2 mutants judged  [" in shown and "\rp3  2/2 mutants judged  [" in shown
    assert shown.endswith("\r" + progress.ERASE)  # erased at the end: the report follows on a clean line
    log = re.sub(r"\r[^\r\n]*?" + re.escape(progress.ERASE), "", shown)  # what stays on the screen
    assert log == "p3 swap-args, line 7: survived (the arguments swapped)\np3: 2 mutants judged in 0:00\n", log
