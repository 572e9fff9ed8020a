"""sim.cuda, torch.cuda's timing events on a rank's clock (puzzles/simulator/timing.py): a rank measures its own
device's time, K times as long on a straggler (CostModel.slow_ranks), not the time it waits for others; the same
program runs on gloo, where the grader's tracker keeps the same clock; outside any run it reads the wall clock."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist

from puzzles import sim
from puzzles.sim import cuda
from puzzles.simulator.cost import TICKS_PER_MS

X = torch.randn(16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def timed_product(dist, x):
    """Rank r times (x @ x.T).tanh() after an all-reduce that waits for the slowest rank: a tensor of each rank's
    milliseconds, all-gathered."""
    dist.all_reduce(x.sum().reshape(1))  # everyone starts the timing together, after the slowest
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    start.record()
    (x @ x.T).tanh()
    end.record()
    end.synchronize()
    mine = torch.tensor([start.elapsed_time(end)], dtype=torch.float64)
    times = torch.empty(dist.get_world_size(), dtype=torch.float64)
    dist.all_gather_into_tensor(times, mine)
    return times


def ticks_of_each_op() -> list[int]:
    """The product's two ops, each as a fast device charges it."""
    y = X @ X.T
    with sim.tally() as product:
        X @ X.T
    with sim.tally() as tanh:
        y.tanh()
    return [product.ticks, tanh.ticks]


@pytest.mark.parametrize("k", [2, Fraction(3, 2)])
def test_a_slow_rank_measures_k_times_as_long_and_the_others_their_own_time(k):
    result = sim.run(timed_product, 4, args=(X,), cost=sim.CostModel(slow_ranks=((2, k),)))
    times = result.results[0]
    assert all(torch.equal(times, t) for t in result.results)  # every rank gathered the same times
    ops = ticks_of_each_op()
    fast, slow = sum(ops) / TICKS_PER_MS, sum(-(-t * k // 1) for t in ops) / TICKS_PER_MS  # each op rounded up
    assert times.tolist() == [fast, fast, slow, fast] and slow > fast > 0


def test_the_ticks_are_milliseconds_of_a_nanosecond_tick():
    assert TICKS_PER_MS == 1_000_000  # cost.py: think of a tick as a nanosecond


def test_elapsed_time_refuses_what_torch_refuses():
    def refuse(dist):
        untimed, timed = cuda.Event(), cuda.Event(enable_timing=True)
        untimed.record()
        timed.record()
        with pytest.raises(RuntimeError, match="enable_timing"):
            untimed.elapsed_time(timed)
        with pytest.raises(RuntimeError, match="recorded"):
            timed.elapsed_time(cuda.Event(enable_timing=True))
        return True

    assert sim.run(refuse, 1).results == [True]


def test_outside_a_run_it_reads_the_wall_clock():
    if torch.cuda.is_available():
        pytest.skip("on a GPU the events are torch.cuda's own")
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record()
    end.synchronize()
    assert 15 <= start.elapsed_time(end) < 2_000


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="gloo is not available")
def test_the_same_program_runs_on_gloo_and_measures_the_same():
    from grader.backends import real

    cost = sim.CostModel(slow_ranks=((1, 2),))
    [outcome] = real.run_tasks([real.FunctionTask(timed_product, (X,), cost=cost)], 2, timeout=30.0, detail=False)
    assert outcome.ok, outcome.error
    simulated = sim.run(timed_product, 2, args=(X,), cost=cost).results[0]
    for r in range(2):
        assert torch.equal(outcome.payloads[r]["result"], simulated), r


def test_with_a_host_synchronize_is_a_sync_on_its_track():
    """With a host (p21's machine), the host runs ahead of the device: end.synchronize() makes it wait for the
    device, as a sync, and the event still measures the device's time, not the host's launches."""
    def timed(dist, x):
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        (x @ x.T).tanh()
        end.record()
        end.synchronize()
        return torch.tensor([start.elapsed_time(end)], dtype=torch.float64)

    result = sim.run(timed, 1, args=(X,), host=sim.HostProfile())
    syncs = result.events_of(0, "host", "sync")
    assert [e.op for e in syncs] == ["Event.synchronize()"]
    assert result.results[0].item() * TICKS_PER_MS >= sum(ticks_of_each_op())
