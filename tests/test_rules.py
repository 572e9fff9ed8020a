"""The rules several puzzles share (grader/core/rules.py), on hand-made observations: what they measure, and what
they refuse to guess."""

from grader.core.result import Budget
from grader.core.rules import (communication_check, compute_check, exposed_communication, most_held, overlap_check,
                               sized_like, work_sequence)
from grader.core.spec import Observation
from puzzles.sim import PUZZLE_GPU


def event(rank, stream, kind, start, end, flops=0, wire_bytes=0, phase="", products=None, op=""):
    return {"rank": rank, "stream": stream, "kind": kind, "start": start, "end": end, "flops": flops,
            "nbytes": wire_bytes, "wire_bytes": wire_bytes, "label": "", "phase": phase, "peers": (), "site": "",
            "ops": 1, "product_flops": flops if products is None else products, "op": op}


def observation(events, ranks=2):
    return Observation([{}] * ranks, [0] * ranks, [{}] * ranks, events, max((e["end"] for e in events), default=0))


def test_work_sequence_reads_microbatches_off_the_flops_however_the_events_are_cut():
    f = 10
    events = [event(0, "compute", "forward", 0, 1, 2 * f),  # two forwards merged into one event
              event(0, "compute", "forward", 1, 2, f // 2),  # half a forward: it has begun
              event(0, "compute", "backward", 2, 3, f),  # half a backward: not done yet
              event(0, "compute", "forward", 3, 4, f // 2),
              event(0, "compute", "backward", 4, 5, 5 * f)]
    sequence = work_sequence(observation(events), 0, f, 2 * f)
    assert sequence == "FFFBBB"
    assert most_held(sequence) == (3, 2)


def test_compute_check_has_a_ceiling_and_a_floor():
    budget = Budget("compute", "share", 100, "count")
    ok = compute_check(observation([event(0, "compute", "forward", 0, 1, 100), event(1, "compute", "forward", 0, 1, 90)]),
                       budget, least=90)
    assert ok.passed and "within" in ok.message
    over = compute_check(observation([event(1, "compute", "backward", 0, 1, 400)]), budget,
                         diagnose=lambda r, fwd, bwd: f"rank {r}: {fwd}+{bwd}")
    assert not over.passed and over.diagnosis == "rank 1: 0+400"
    under = compute_check(observation([event(0, "compute", "forward", 0, 1, 100)]), budget, least=50)
    assert not under.passed and "skipped" in under.diagnosis and "rank 1" in under.message


def test_the_floor_counts_products_only_so_products_written_out_of_elements_fail_it():
    """A rank that computes its share's FLOPs in elementwise multiplies and sums meets the ceiling (every op
    counts) but not the floor (none of them are products), and the diagnosis says what it did."""
    budget = Budget("compute", "share", 1000, "count")
    written_out = observation([event(0, "compute", "forward", 0, 9, 950, products=50, op="mul x3, sum x3"),
                               event(1, "compute", "forward", 0, 1, 950, products=900)])
    check = compute_check(written_out, budget, least=900)
    assert not check.passed and "rank 0" in check.message and "50 of them in matrix products" in check.message
    assert "written as elementwise multiplies and sums" in check.diagnosis, check.diagnosis
    padded = observation([event(0, "compute", "forward", 0, 9, 1900, products=950)], ranks=1)
    check = compute_check(padded, budget, least=900)  # dummy matmuls on top of elementwise products: over
    assert not check.passed and "over the budget" in check.message


def test_communication_counts_what_each_rank_sends_in_the_phase_asked():
    events = [event(0, "comm", "reduce_scatter_tensor", 0, 1, wire_bytes=30, phase="backward"),
              event(0, "comm", "all_gather_into_tensor", 1, 2, wire_bytes=30, phase="forward"),
              event(1, "comm", "recv", 0, 1, wire_bytes=500, phase="forward")]  # counted by its sender
    budget = Budget("communication", "x", 60, "bytes")
    assert communication_check(observation(events), budget).passed
    assert communication_check(observation(events), Budget("b", "x", 30, "bytes"), phase="forward").passed
    assert not communication_check(observation(events), Budget("b", "x", 29, "bytes"), phase="backward").passed


def test_an_excess_is_named_only_when_its_size_singles_one_thing_out():
    assert sized_like(65_536 + 4, {"full": 65_536, "shard": 16_384}) == "full"
    assert sized_like(40_000, {"full": 65_536, "shard": 16_384}) is None
    assert sized_like(100, {"a": 100, "b": 200}) is None  # both within 1 KiB: ambiguous, so neither


def message(rank, start, end, issued=None, kind="all_reduce"):
    e = event(rank, "comm", kind, start, end, wire_bytes=1024)
    e["issued"] = start if issued is None else issued
    return e


def test_filler_under_a_message_hides_nothing_whatever_its_size():
    """Exposed communication is the makespan less the compute stream's work: ticks that ran while a message was in
    flight count as work only as far as their arithmetic explains them. A rank that waits out each message with
    copies (no FLOPs) exposes all of it, as if it had sat idle; the same ticks spent on matmuls hide it."""
    c = 2000  # the step's compute: the 1.25·C cap plays no part here
    budget = Budget("makespan", "one message", 100, "ticks")
    backward = event(0, "compute", "backward", 0, 1000, flops=1000 * 1024)  # compute-bound: all explained
    idle = observation([backward, message(0, 1000, 1400), event(0, "compute", "forward", 1400, 1500, 100 * 1024)],
                       ranks=1)
    copies = observation([backward, message(0, 1000, 1400), event(0, "compute", "backward", 1000, 1400, 0, op="clone"),
                          event(0, "compute", "forward", 1400, 1500, 100 * 1024)], ranks=1)
    hidden = observation([event(0, "compute", "backward", 0, 1000, flops=1000 * 1024), message(0, 100, 500),
                          event(0, "compute", "forward", 1000, 1100, 100 * 1024)], ranks=1)
    for obs in (idle, copies):
        assert exposed_communication(obs, c, PUZZLE_GPU)[2] == 400
        assert not overlap_check(obs, budget, c, PUZZLE_GPU).passed
    assert exposed_communication(copies, c)[2] == 0  # what the old measure, compute counted whole, made of it
    check = overlap_check(copies, budget, c, PUZZLE_GPU)
    assert "hide nothing" in check.diagnosis and "400" in check.message, check.diagnosis
    assert overlap_check(hidden, budget, c, PUZZLE_GPU).passed


def test_elementwise_work_under_a_message_is_work_and_copies_elsewhere_are_not_counted_against_it():
    """An elementwise pass (its time explained by its memory traffic, 3 float64 operands a FLOP) hides a message
    like a matmul; copies that run while nothing is in flight (a bucket filled before its message leaves) are the
    answer's style and cost it nothing here."""
    c = 1000
    budget = Budget("makespan", "one message", 100, "ticks")
    flops = 300 * PUZZLE_GPU.memory_bytes_per_tick // 24  # a memory-bound elementwise op of 300 ticks
    obs = observation([event(0, "compute", "backward", 0, 200, 0, op="cat"),  # the bucket, before its message
                       message(0, 200, 500, issued=200),
                       event(0, "compute", "backward", 200, 500, flops, products=0, op="add x4")], ranks=1)
    assert exposed_communication(obs, c, PUZZLE_GPU)[2] == 0
    assert overlap_check(obs, budget, c, PUZZLE_GPU).passed
