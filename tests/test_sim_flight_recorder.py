"""The flight recorder and the collective timeout (puzzles/simulator/flight_recorder.py, fr_analysis.py,
watchdog.py), against what torch does: the records carry torch's fields and sequence numbers, a hang ends in the
watchdog's timeout on every rank that waits, the analysis names the first collective at which the ranks part and
the ranks that never arrived, and raising the timeout changes when the run fails, never whether. The same programs
run on gloo, whose own flight recorder (on by default in torch 2.13) must hold the same records."""

from __future__ import annotations

import datetime
import json

import pytest
import torch
import torch.distributed as dist
from debugging_helpers import agreeing_calls, skips_a_step

from puzzles import sim
from puzzles.simulator.fr_analysis import NOT_ALL_JOINED, SIZE, TYPE, UNMATCHED_P2P


def run_expecting(error_type, fn, n=4, **options):
    with pytest.raises(error_type) as info:
        sim.run(fn, n, **options)
    return info.value


# ---- the hang: a rank skips a step


def test_a_skipped_collective_times_out_on_every_rank_that_waits():
    error = run_expecting(sim.CollectiveTimeoutError, skips_a_step, collective_timeout=1000)
    text = str(error)
    for rank in (0, 1, 3):  # the ranks that wait; rank 2 returned
        assert (f"[Rank {rank}] Watchdog caught collective operation timeout: WorkSim(SeqNum=3, OpType=ALLREDUCE, "
                f"NumelIn=4, NumelOut=4, Timeout(ticks)=1000) ran for 1,000 ticks before timing out") in text, text
    assert "[Rank 2]" not in text
    assert isinstance(error, sim.DeadlockError)  # a hang is still a deadlock: code that catches one catches both
    analysis = error.flight_recorder.analyze()
    assert analysis.first.kind == NOT_ALL_JOINED and analysis.first.seq == 3 and analysis.missing_ranks == [2]
    assert analysis.first.last_of_missing[2]["collective_seq_id"] == 2
    notes = "\n".join(error.__notes__)
    assert "not all ranks joining collective, sequence number 3 on group 0:default_pg" in notes
    assert "missing ranks: [2]" in notes


def test_raising_the_timeout_changes_when_the_run_fails_never_whether():
    first = [run_expecting(sim.CollectiveTimeoutError, skips_a_step, collective_timeout=t) for t in (1000, 10**12)]
    fired = [int(str(e).split("The first watchdog fired at tick ")[1].split(".")[0].replace(",", "")) for e in first]
    assert fired[1] - fired[0] == 10**12 - 1000
    hours = run_expecting(sim.CollectiveTimeoutError, skips_a_step, collective_timeout=datetime.timedelta(hours=1))
    assert "Timeout(ticks)=3600000000000" in str(hours)  # a tick is a nanosecond


def test_without_a_timeout_a_hang_is_the_deadlock_it_always_was_and_nothing_is_recorded():
    error = run_expecting(sim.DeadlockError, skips_a_step)
    assert type(error) is sim.DeadlockError and not hasattr(error, "flight_recorder")
    assert sim.run(agreeing_calls, 4).flight_recorder is None


# ---- the records


def test_records_carry_torchs_fields_in_issue_order():
    dump = sim.run(agreeing_calls, 4, trace_buffer_size=10).flight_recorder
    ops = [(e["collective_seq_id"], e["profiling_name"], e["input_sizes"], e["output_sizes"], e["input_dtypes"],
            e["state"]) for e in dump.ranks[1]]
    assert ops == [(1, "sim:all_reduce", [[4]], [[4]], ["Double"], "completed"),
                   (2, "sim:broadcast", [[4]], [[4]], ["Double"], "completed"),
                   (3, "sim:all_gather", [[4]], [[4, 4]], ["Double"], "completed"),
                   (4, "sim:barrier", [], [], [], "completed"),
                   (5, "sim:all_reduce", [[2, 3]], [[2, 3]], ["Float"], "completed")]
    first = dump.ranks[1][0]
    assert first["process_group"] == ("0", "default_pg") and first["record_id"] == 0 and not first["is_p2p"]
    assert first["time_started"] >= first["time_created"] and first["time_completed"] > first["time_started"]
    assert first["frames"][0].startswith("debugging_helpers.py:") and "dist.all_reduce(t)" in first["frames"][0]
    assert dump.analyze().findings == []
    assert "agree on every collective" in dump.analyze().text()


def test_the_ring_buffer_keeps_the_last_records_and_the_analysis_reads_what_every_rank_holds():
    error = run_expecting(sim.CollectiveTimeoutError, skips_a_step, collective_timeout=1000, trace_buffer_size=1)
    dump = error.flight_recorder
    assert [len(r) for r in dump.ranks] == [1, 1, 1, 1]
    assert [r[0]["record_id"] for r in dump.ranks] == [2, 2, 1, 2]  # rank 2 made one record fewer
    assert dump.analyze().first.seq == 3 and dump.analyze().missing_ranks == [2]


def test_a_group_records_its_own_sequence_numbers_and_timeout():
    """In a run with a collective timeout, a group made with a timeout of its own times out by it; in a run
    without one, a hang is named at once whatever timeout a group was made with (tests/corpus/errors.py)."""
    def on_a_group(dist):
        pair = dist.new_group([0, 1], timeout=datetime.timedelta(microseconds=5))
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(2), group=pair)
        return None

    error = run_expecting(sim.CollectiveTimeoutError, on_a_group, n=2, collective_timeout=10**9)
    assert "Timeout(ticks)=5000" in str(error) and "[Rank 0]" in str(error)
    record = error.flight_recorder.ranks[0][-1]
    assert record["process_group"] == ("1", "undefined") and record["collective_seq_id"] == 1
    assert error.flight_recorder.analyze().first.missing == [1]


# ---- what the analysis names


def test_the_analysis_names_a_collective_of_another_type():
    def other_call(dist):
        t = torch.ones(4)
        dist.all_reduce(t)
        (dist.broadcast(t, 0) if dist.get_rank() == 1 else dist.all_reduce(t))

    error = run_expecting(sim.CollectiveMismatchError, other_call, n=2, trace_buffer_size=4)
    first = error.flight_recorder.analyze().first
    assert (first.kind, first.seq, sorted(first.entries)) == (TYPE, 2, [0, 1])
    assert "COLLECTIVE_TYPE_MISMATCH, sequence number 2" in "\n".join(error.__notes__)


def test_the_analysis_names_ranks_out_of_step_by_their_sizes():
    def out_of_step(dist):  # rank 1 skips its gradients' all-reduce: its loss meets the others' gradients
        grads, loss = torch.ones(8), torch.ones(1)
        if dist.get_rank() != 1:
            dist.all_reduce(grads)
        dist.all_reduce(loss)

    error = run_expecting(sim.CollectiveMismatchError, out_of_step, n=2, trace_buffer_size=4)
    first = error.flight_recorder.analyze().first
    assert (first.kind, first.seq) == (SIZE, 1)
    assert first.entries[0]["input_sizes"] == [[8]] and first.entries[1]["input_sizes"] == [[1]]


def test_the_analysis_names_a_send_that_no_rank_receives():
    def lonely_send(dist):
        if dist.get_rank() == 0:
            dist.send(torch.ones(3), 1)

    error = run_expecting(sim.CollectiveTimeoutError, lonely_send, n=2, collective_timeout=50)
    first = error.flight_recorder.analyze().first
    assert first.kind == UNMATCHED_P2P and list(first.entries) == [0]
    assert first.entries[0]["profiling_name"] == "sim:send 0->1" and first.entries[0]["p2p_seq_id"] == 1
    assert "OpType=SEND" in str(error)


# ---- a partner later than the timeout (a straggler)


def late_rank(dist):
    x = torch.ones(64, 64, dtype=torch.float64)
    if dist.get_rank() == 1:
        for _ in range(20):  # 20 x (a matmul of 524,288 FLOPs, 516 ticks, and a division, 37): 11,060 ticks
            x = x @ x / 64
    dist.all_reduce(x)
    return None


def test_a_call_completed_later_than_its_timeout_fails_the_rank_that_waited_and_names_the_late_one():
    error = run_expecting(sim.CollectiveTimeoutError, late_rank, n=2, collective_timeout=5000)
    text = str(error)
    assert text.startswith("[Rank 0] Watchdog caught collective operation timeout: WorkSim(SeqNum=1") and \
           "rank(s) [1] issued it last, at tick 11,060" in text, text
    sim.run(late_rank, 2, collective_timeout=20_000)  # a timeout above the straggler's delay: no error


def test_a_dump_reads_back_from_json():
    dump = sim.run(agreeing_calls, 2, trace_buffer_size=3).flight_recorder
    again = sim.FlightRecorderDump.from_json(dump.to_json())
    assert json.loads(again.to_json()) == json.loads(dump.to_json())
    assert [len(r) for r in again.ranks] == [3, 3]


# ---- against gloo's own flight recorder


def _identity(entry: dict) -> tuple:
    """What a record says about its call, backend aside (gloo: 'gloo:all_reduce'; the simulator: 'sim:...')."""
    return (tuple(entry["process_group"]), entry["collective_seq_id"], entry["profiling_name"].split(":")[1],
            entry["input_sizes"], entry["output_sizes"], entry["input_dtypes"])


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="gloo is not available")
@pytest.mark.parametrize("program", [skips_a_step, agreeing_calls], ids=["hang", "agree"])
def test_the_records_are_gloos_and_gloo_times_out_on_the_ranks_the_watchdog_names(program):
    from grader.backends import real

    # gloo's timeout: 6 s, so that a rank a loaded machine holds back is not taken for one that never comes; the
    # harness waits longer than that for the ranks to report it
    [outcome] = real.run_tasks([real.FunctionTask(program)], 4, timeout=6.0, detail=False, hang_grace=60.0)
    assert outcome.ok, outcome.error
    on_gloo = [json.loads(p["result"]["dump"]) for p in outcome.payloads]
    try:
        dump, timed_out = sim.run(program, 4, collective_timeout=1000).flight_recorder, []
    except sim.CollectiveTimeoutError as error:
        dump = error.flight_recorder
        timed_out = sorted(int(line.split("]")[0][6:]) for line in str(error).splitlines()
                           if line.startswith("[Rank "))
    for rank in range(4):
        gloo = [_identity(e) for e in on_gloo[rank]["entries"] if e["process_group"][1] == "default_pg"]
        assert gloo == [_identity(e) for e in dump.ranks[rank]], f"rank {rank}"
        assert {e["state"] for e in on_gloo[rank]["entries"]} <= {"scheduled"}  # gloo tracks no progress
    # gloo raises on every rank that waits: its own timeout on the first whose timer fires, and either that or a
    # closed connection on the others (whichever comes first there depends on the machine's timing)
    errors = [outcome.payloads[r]["result"]["error"] for r in range(4)]
    assert [r for r in range(4) if errors[r]] == timed_out, errors
    assert not timed_out or any("Timed out" in e for e in errors), errors
