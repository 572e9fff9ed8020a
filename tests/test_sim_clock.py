"""The simulated clock: integer ticks from the cost model, overlap of async communication, labels, and the same
timeline on every run."""

import math

import pytest
import torch
from torch.profiler import record_function

from puzzles import sim
from puzzles.sim import CostModel

COST = CostModel(flops_per_tick=1, latency_ticks=7, bytes_per_tick=3)


def matmul_ticks(m, k, n, cost=COST):
    return cost.compute_ticks(2 * m * k * n)


# ---- the ring formulas


def ceil_div(a, b):
    return -(-a // b)


def ring_ticks(kind, nbytes, n, alpha=COST.latency_ticks, beta=COST.bytes_per_tick):
    """The issue's formulas, written out again here (not taken from CostModel)."""
    if kind in ("send", "recv"):
        return alpha + ceil_div(nbytes, beta)
    if n == 1:
        return 0
    if kind == "all_reduce":
        return 2 * (n - 1) * alpha + ceil_div(2 * (n - 1) * nbytes, n * beta)
    if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
        return (n - 1) * alpha + ceil_div((n - 1) * nbytes, n * beta)
    if kind == "broadcast":
        return (n - 1) * alpha + ceil_div(nbytes, beta)
    assert kind == "barrier"
    return 2 * (n - 1) * alpha


def one_collective(kind, numel):
    """fn running one `kind` of `numel` float64 per rank; returns (fn, the full buffer's bytes)."""

    def fn(dist):
        n, x = dist.get_world_size(), torch.zeros(numel, dtype=torch.float64)
        if kind == "all_reduce":
            dist.all_reduce(x)
        elif kind == "all_gather":
            dist.all_gather([torch.empty_like(x) for _ in range(n)], x)
        elif kind == "all_gather_into_tensor":
            dist.all_gather_into_tensor(torch.empty(n * numel, dtype=torch.float64), x)
        elif kind == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(torch.empty(numel // n, dtype=torch.float64), x)
        elif kind == "broadcast":
            dist.broadcast(x, src=0)
        else:
            dist.barrier()

    return fn


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
                                  "broadcast", "barrier"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_collective_ticks_follow_the_ring_formulas(n, kind):
    numel = 5 * n  # 40n bytes: the bandwidth terms do not divide evenly, so rounding up is tested too
    result = sim.run(one_collective(kind, numel), n, cost=COST)
    full = numel * 8 * (n if kind in ("all_gather", "all_gather_into_tensor") else 1)
    expected = ring_ticks(kind, full, n)
    events = result.events_of(stream="comm")
    assert [(e.rank, e.kind, e.start, e.end) for e in events] == [(r, kind, 0, expected) for r in range(n)], events
    assert result.makespan == expected
    if kind != "barrier":
        assert all(e.nbytes == full for e in events), events


@pytest.mark.parametrize("numel", [1, 5, 13])
def test_point_to_point_ticks(numel):
    def fn(dist):
        x = torch.zeros(numel, dtype=torch.float64)
        (dist.send if dist.get_rank() == 0 else dist.recv)(x, 1 - dist.get_rank())

    result = sim.run(fn, 2, cost=COST)
    expected = ring_ticks("send", numel * 8, 2)
    got = [(e.rank, e.kind, e.start, e.end, e.peers) for e in result.events]
    assert got == [(0, "send", 0, expected, (0, 1)), (1, "recv", 0, expected, (0, 1))], got


def test_cost_model_formulas_match_the_written_out_ones():
    for n in (1, 2, 3, 4, 8):
        for nbytes in (1, 40, 1001):
            for kind in ("send", "all_reduce", "all_gather", "reduce_scatter_tensor", "broadcast", "barrier"):
                assert COST.comm_ticks(kind, nbytes, n) == ring_ticks(kind, nbytes, n), (kind, nbytes, n)


# ---- when things start


def test_a_collective_starts_when_its_last_participant_arrives():
    m = 6

    def fn(dist):
        a = torch.ones(m, m, dtype=torch.float64)
        for _ in range(dist.get_rank()):  # rank r arrives after r matmuls
            a = a @ a / m
        dist.all_reduce(a)
        return a @ a

    n = 4
    result = sim.run(fn, n, cost=COST)
    arrive = (n - 1) * matmul_ticks(m, m, m)
    end = arrive + ring_ticks("all_reduce", m * m * 8, n)
    for r in range(n):
        (comm,) = result.events_of(r, "comm")
        assert (comm.start, comm.end) == (arrive, end), f"rank {r}: {comm}"
        last = result.events_of(r, "compute")[-1]  # the matmul after the sync all_reduce waits for it
        assert (last.start, last.end) == (end, end + matmul_ticks(m, m, m)), f"rank {r}: {last}"
    assert result.makespan == end + matmul_ticks(m, m, m)


@pytest.mark.parametrize("numel, m", [(300, 4), (30, 12), (30, 40)])
def test_async_all_reduce_overlaps_compute_by_what_the_cost_model_predicts(numel, m):
    def fn(dist, overlap):
        grad = torch.ones(numel, dtype=torch.float64)
        a = torch.ones(m, m, dtype=torch.float64)
        if overlap:
            work = dist.all_reduce(grad, async_op=True)
            a @ a
            work.wait()
        else:
            dist.all_reduce(grad)
            a @ a
        return grad

    comm = COST.comm_ticks("all_reduce", numel * 8, 2)
    compute = COST.compute_ticks(2 * m * m * m)
    serial, overlapped = (sim.run(fn, 2, args=(overlap,), cost=COST) for overlap in (False, True))
    assert serial.makespan == comm + compute, (serial.makespan, comm, compute)
    assert overlapped.makespan == max(comm, compute), (overlapped.makespan, comm, compute)
    assert serial.makespan - overlapped.makespan == min(comm, compute)
    assert overlapped.results[0].tolist() == [2.0] * numel


def test_async_ops_queue_on_the_comm_stream():
    def fn(dist):
        a, b = torch.ones(10, dtype=torch.float64), torch.ones(20, dtype=torch.float64)
        works = [dist.all_reduce(a, async_op=True), dist.all_reduce(b, async_op=True)]
        for w in works:
            w.wait()

    first, second = (COST.comm_ticks("all_reduce", numel * 8, 3) for numel in (10, 20))
    result = sim.run(fn, 3, cost=COST)
    for r in range(3):
        spans = [(e.start, e.end) for e in result.events_of(r, "comm")]
        assert spans == [(0, first), (first, first + second)], f"rank {r}: {spans}"
    assert result.makespan == first + second


def test_compute_events_carry_phase_label_and_flops():
    m, k, n = 3, 4, 5

    def fn(dist):
        x = torch.ones(m, k, dtype=torch.float64, requires_grad=True)
        w = torch.ones(k, n, dtype=torch.float64, requires_grad=True)
        w.register_hook(lambda g: dist.all_reduce(g))  # runs inside the backward pass
        with record_function("F0"):
            y = x @ w
        with record_function("B0"):
            y.sum().backward()
        return w.grad

    result = sim.run(fn, 2, cost=COST)
    compute = [(e.kind, e.label, e.flops, e.ticks) for e in result.events_of(0, "compute")]
    fwd = 2 * m * k * n
    assert compute == [("forward", "F0", fwd, fwd), ("backward", "B0", 2 * fwd, 2 * fwd)], compute
    (comm,) = result.events_of(0, "comm")
    assert (comm.kind, comm.phase, comm.label) == ("all_reduce", "backward", "B0"), comm
    assert result.results[0].tolist() == [[2.0 * m] * n] * k


# ---- the same timeline on every run


def pipeline_and_all_reduce(dist):
    """Two stages, two microbatches, then an async all-reduce of the weight gradients across the stages."""
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    w = (0.1 * torch.randn(8, 8, dtype=torch.float64)).requires_grad_()
    for mb in range(2):
        with record_function(f"F{mb}"):
            x = torch.randn(4, 8, dtype=torch.float64) if rank == 0 else torch.empty(4, 8, dtype=torch.float64)
            if rank == 1:
                dist.recv(x, peer)
            y = torch.tanh(x @ w)
            if rank == 0:
                dist.send(y.detach(), peer)
        with record_function(f"B{mb}"):
            grad = torch.empty(4, 8, dtype=torch.float64)
            if rank == 0:
                dist.recv(grad, peer)
                y.backward(grad)
            else:
                y.sum().backward()
                dist.send(torch.ones(4, 8, dtype=torch.float64), peer)
    work = dist.all_reduce(w.grad, async_op=True)
    z = torch.randn(8, 8, dtype=torch.float64) @ w.detach()
    work.wait()
    return w.grad, z


def test_twenty_runs_give_the_same_events_ledgers_and_values():
    first = None
    for _ in range(20):
        result = sim.run(pipeline_and_all_reduce, 2, cost=COST)
        record = ([e.to_dict() for e in result.events], [ledger.timeline for ledger in result.ledgers],
                  [[t.tolist() for t in values] for values in result.results], result.makespan)
        if first is None:
            first = record
            assert len(record[0]) > 10, record[0]  # a program with something to schedule
        assert record == first


def test_infinite_bandwidth_makes_messages_cost_their_latency_only():
    cost = sim.CostModel(flops_per_tick=1, latency_ticks=3, bytes_per_tick=None)
    assert cost.comm_ticks("send", 1 << 20, 2) == 3
    assert cost.comm_ticks("all_reduce", 1 << 20, 4) == 2 * 3 * 3
    with pytest.raises(ValueError):
        sim.CostModel(bytes_per_tick=0)


def test_an_uneven_all_to_all_costs_what_its_busiest_rank_moves():
    """(N-1)·alpha + the most bytes any rank sends to or receives from the others, over the bandwidth; each rank's
    wire bytes are what it sends to the others (what leaves the rank, the figure an expert-parallel puzzle checks)."""
    cost = CostModel(flops_per_tick=1000, latency_ticks=7, bytes_per_tick=8)
    n, width = 4, 3

    def rank(dist):
        me = dist.get_rank()
        sends = [me + j + 1 for j in range(n)]  # rank i sends i + j + 1 rows to rank j
        receives = [i + me + 1 for i in range(n)]
        out = torch.empty(sum(receives), width, dtype=torch.float64)
        dist.all_to_all_single(out, torch.ones(sum(sends), width, dtype=torch.float64), output_split_sizes=receives,
                               input_split_sizes=sends)

    result = sim.run(rank, world_size=n, cost=cost)
    row = width * 8
    sent = [sum(i + j + 1 for j in range(n) if j != i) * row for i in range(n)]  # receiving is symmetric here
    busiest = max(sent)
    events = result.events_of(stream="comm", kind="all_to_all_single")
    assert [e.wire_bytes for e in sorted(events, key=lambda e: e.rank)] == sent
    assert {e.ticks for e in events} == {(n - 1) * 7 + math.ceil(busiest / 8)}


def test_all_to_all_split_sizes_that_disagree_name_both_ranks():
    def rank(dist):
        receives = [1, 1] if dist.get_rank() == 0 else [2, 1]
        out = torch.empty(sum(receives), dtype=torch.float64)
        dist.all_to_all_single(out, torch.ones(2, dtype=torch.float64), output_split_sizes=receives,
                               input_split_sizes=[1, 1])

    with pytest.raises(sim.CollectiveMismatchError) as info:
        sim.run(rank, world_size=2)
    message = str(info.value)
    assert "rank 0 sends 1 rows to rank 1" in message and "rank 1 expects 2 rows from rank 0" in message, message


@pytest.mark.parametrize("speedup", [1, 4])
def test_half_precision_computes_as_fast_as_the_cost_model_says(speedup):
    cost = CostModel(flops_per_tick=1024, half_precision_speedup=speedup)

    def rank(dist):
        a64 = torch.ones(64, 64, dtype=torch.float32)
        a64 @ a64
        a16 = torch.ones(64, 64, dtype=torch.float16)
        a16 @ a16

    result = sim.run(rank, world_size=1, cost=cost)
    assert sum(e.flops for e in result.events_of(0, "compute")) == 2 * 2 * 64 ** 3
    assert result.busy_ticks(0) == 2 * 64 ** 3 // 1024 + 2 * 64 ** 3 // (1024 * speedup)
