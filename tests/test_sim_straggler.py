"""A straggler (CostModel.slow_ranks): one rank's device takes k times as long for every op, so the others wait for
it at every collective. Held: its compute events are k times as long (rounded up per op), the others' are not, the
waiting shows as the fast ranks' idle time before the collective, nothing else changes (values, bytes, memory),
and real processes graded with the same cost model charge the same ticks (their tracker shares the clock's code)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
import torch.distributed as dist

from puzzles import sim

X = torch.randn(16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def step(dist, x):
    y = (x @ x.T).tanh()  # 32,768 FLOPs, then an elementwise op
    dist.all_reduce(y)
    return y


def compute_ticks(result, rank):
    return [e.ticks for e in result.events_of(rank, "compute")]


@pytest.mark.parametrize("k", [3, Fraction(3, 2)])
def test_a_slow_rank_takes_k_times_as_long_and_the_others_wait_for_it(k):
    even = sim.run(step, 4, args=(X,))
    slow = sim.run(step, 4, args=(X,), cost=sim.CostModel(slow_ranks=((2, k),)))
    for r in range(4):
        expected = [-(-t * k // 1) if r == 2 else t for t in compute_ticks(even, r)]
        assert compute_ticks(slow, r) == expected, r
    reduce = {e.rank: e for e in slow.events_of(kind="all_reduce")}
    assert all(reduce[r].start == slow.events_of(2, "compute")[-1].end for r in range(4))  # when rank 2 arrives
    fast_idle = reduce[0].start - even.events_of(0, "compute")[-1].end
    assert fast_idle == sum(compute_ticks(slow, 2)) - sum(compute_ticks(even, 2)) > 0
    assert all(torch.equal(a, b) for a, b in zip(slow.results, even.results))
    assert slow.peak_bytes == even.peak_bytes and slow.flops == even.flops


def test_a_slowdown_below_one_or_malformed_is_refused():
    for bad in (((1, Fraction(1, 2)),), ((1,),)):
        with pytest.raises(ValueError, match="slow_ranks"):
            sim.CostModel(slow_ranks=bad)


def test_the_cost_model_says_which_rank_is_slow():
    assert "rank 2's device 3x slower" in sim.CostModel(slow_ranks=((2, 3),)).describe()


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="gloo is not available")
def test_real_processes_charge_the_straggler_the_same_ticks():
    from grader.backends import real

    cost = sim.CostModel(slow_ranks=((1, 3),))
    [outcome] = real.run_tasks([real.FunctionTask(step, (X,), cost=cost)], 2, timeout=30.0, detail=False)
    assert outcome.ok, outcome.error
    simulated = sim.run(step, 2, args=(X,), cost=cost)
    for r in range(2):
        on_gloo = [e["end"] - e["start"] for e in outcome.payloads[r]["events"] if e["stream"] == "compute"]
        assert on_gloo == compute_ticks(simulated, r), r
