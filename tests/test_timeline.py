"""The run's timeline as Chrome trace-event JSON (Perfetto) and as a text grid: the file follows the format
(required keys and types, events on one track nest, never cross), and it agrees with the ledger and the clock."""

import json
import re
import subprocess
import sys

import pytest

from grader.backends.simulator import grade_file
from grader.frontends import timeline
from grader.frontends.targets import REPO
from grader.specs import SPECS

KINDS = {"X": {"name": str, "cat": str, "pid": int, "tid": int, "ts": (int, float), "dur": (int, float),
               "args": dict},
         "M": {"name": str, "pid": int, "tid": int, "args": dict},
         "C": {"name": str, "pid": int, "tid": int, "ts": (int, float), "args": dict}}


def graded(puzzle: str, folder: str = "solutions"):
    spec = SPECS[puzzle]
    return grade_file(spec, REPO / folder / spec.filename, seed=0)


def check_format(trace: dict) -> None:
    """What Perfetto's and chrome://tracing's JSON importers need: an object with a traceEvents list, each event
    of a known phase with its keys and types, and complete events ('X') that nest on each (pid, tid) track."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    assert trace.get("displayTimeUnit") in ("ms", "ns")
    tracks: dict = {}
    for e in trace["traceEvents"]:
        assert e["ph"] in KINDS, e
        for key, kind in KINDS[e["ph"]].items():
            assert isinstance(e[key], kind), (key, e)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] > 0, e
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for track, spans in tracks.items():
        open_ = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ and open_[-1] <= start + 1e-9:
                open_.pop()
            assert not open_ or end <= open_[-1] + 1e-9, f"events cross on track {track}: {start}..{end}"
            open_.append(end)


@pytest.mark.parametrize("puzzle", ["p6", "p7", "p10", "p12"])
def test_the_trace_is_valid_and_agrees_with_the_clock_and_the_ledger(puzzle):
    result = graded(puzzle)
    trace = json.loads(json.dumps(timeline.chrome_trace(result)))  # what is written: plain JSON
    check_format(trace)
    events = result.figures["events"]
    ranks = {e["rank"] for e in events}
    assert {e["pid"] for e in trace["traceEvents"]} == ranks
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names[(0, 0)] == "compute"
    for r in ranks:
        busy = sum(e["end"] - e["start"] for e in events if e["rank"] == r and e["stream"] == "compute")
        drawn = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == r and e["tid"] == 0]
        assert sum(e["dur"] for e in drawn) * 1000 == pytest.approx(busy)
        assert sum(e["args"]["flops"] for e in drawn) == sum(e["flops"] for e in events
                                                             if e["rank"] == r and e["stream"] == "compute")
        memory = [e["args"]["bytes"] for e in trace["traceEvents"] if e["ph"] == "C" and e["pid"] == r]
        assert max(memory) == result.peak_bytes[r]
    last = max(e["ts"] + e["dur"] for e in trace["traceEvents"] if e["ph"] == "X")
    assert last * 1000 == pytest.approx(result.figures["makespan"])
    sends = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "communication"]
    assert all({"wire_bytes", "peers", "site"} <= set(e["args"]) for e in sends)


def test_the_text_schedule_draws_1f1b():
    text = timeline.schedule_text(graded("p6"))
    lines = text.splitlines()
    assert lines[0].startswith("p6 ") and "makespan" in lines[0]
    rank0, rank3 = lines[1], lines[7]
    grid0 = rank0.split("|")[1]
    assert grid0.startswith("FFFF") and "B" in grid0 and grid0.index("B") > grid0.index("F")
    assert rank3.split("|")[1].lstrip(".").startswith("FFB")  # the last stage starts backward at once
    assert "busy" in rank0 and "F forward" in lines[-1]


def test_the_text_schedule_draws_every_message_and_names_only_what_it_draws():
    """Issue 30: on p6's clock each message takes one tick of a 470-tick column, and the communication rows were
    empty while the legend listed s and r. A message marks its column however short it is, and the legend names
    the characters drawn, no others."""
    result = graded("p6")
    text = timeline.schedule_text(result)
    lines = text.splitlines()
    comm0 = lines[2].split("|")[1]
    sends = [e for e in result.figures["events"] if e["rank"] == 0 and e["kind"] == "send"]
    recvs = [e for e in result.figures["events"] if e["rank"] == 0 and e["kind"] == "recv"]
    span = int(lines[0].split("one column = ")[1].split()[0].replace(",", ""))
    columns = {e["start"] // span for e in sends + recvs}
    assert {i for i, ch in enumerate(comm0) if ch != "."} == columns, (comm0, sorted(columns))
    assert comm0.count("s") + comm0.count("+") >= len({e["start"] // span for e in sends}) > 0, comm0
    legend = lines[-1]
    drawn = set("".join(line.split("|")[1] for line in lines[1:-1])) - {"."}
    items = re.split(r"\s{2,}", legend.replace("communication, in any part of the column:", "  ").replace("|", ""))
    named = {item.split(" ")[0] for item in items if item.strip()} - {"."}
    assert named == drawn, (named, drawn, legend)
    assert "A all-reduce" not in legend and "s send" in legend and "r recv" in legend


def test_a_run_without_messages_has_no_communication_legend():
    text = timeline.schedule_text(graded("p1"))
    assert "communication" not in text.splitlines()[-1] and "s send" not in text, text.splitlines()[-1]


def test_check_writes_a_trace_per_puzzle_and_prints_the_schedule(tmp_path):
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "grader", "check", "solutions", "-p", "p5,p7", "--seed", "1",
                           "--trace", str(out), "--schedule"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    for puzzle in ("p5", "p7"):
        written = tmp_path / f"run-{puzzle}.json"
        check_format(json.loads(written.read_text()))
        assert f"wrote {written}" in done.stderr and "ui.perfetto.dev" in done.stderr
    assert "p5 Pipeline parallel (GPipe): makespan" in done.stdout and "rank 3  compute |" in done.stdout


def test_the_notebooks_check_writes_the_trace_too(tmp_path, capsys):
    from grader.backends.learner_code import load_module
    from grader.notebook import check

    namespace = vars(load_module(REPO / "solutions" / SPECS["p5"].filename))
    check("p5", dict(namespace), seed=0, plots=False, trace=str(tmp_path / "p5.json"), schedule=True)
    check_format(json.loads((tmp_path / "p5.json").read_text()))
    shown = capsys.readouterr().out
    assert "rank 0  compute |" in shown and "ui.perfetto.dev" in shown
