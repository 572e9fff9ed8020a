"""Checks that cannot be met by impossible figures (issue 29), each attacked at its rule on hand-made observations:
a check that had nothing to measure fails instead of passing, whatever carried the data counts, and a schedule
the clock could not have run is refused."""

from grader.core.result import Budget
from grader.core.spec import Observation
from grader.specs import SPECS
from grader.specs.p2_activation_sharding.spec import C, L, N


def event(rank, stream, kind, start, end, flops=0, nbytes=0, peers=(), products=None):
    return {"rank": rank, "stream": stream, "kind": kind, "start": start, "end": end, "flops": flops,
            "nbytes": nbytes, "wire_bytes": nbytes, "label": "", "phase": "", "peers": peers, "site": "",
            "ops": 1, "product_flops": flops if products is None else products, "op": "", "issued": start}


def observation(events, results, ranks):
    return Observation(results, [0] * ranks, [{}] * ranks, events, max((e["end"] for e in events), default=0))


# ---- p2: nothing gathered is not "nothing gathered late"

P2 = SPECS["p2"]
K = 4
RIGHT = (True, True, True)  # gradients right, forward kept only shards, compute within budget


def p2_budget(name):
    return P2.budgets({"k": K})[name]


def test_a_backward_that_gathers_nothing_fails_both_gather_checks():
    obs = observation([], [{"held_at_gathers": []}] * N, N)
    held = P2.held_check(obs, p2_budget("gathered checkpoints"), K, RIGHT)
    in_time = P2.in_time_check(obs, p2_budget("gathered in time"), K, RIGHT)
    assert not held.passed and "communicated nothing" in held.message
    assert not in_time.passed and "gathered 0 checkpoints' worth" in in_time.message
    assert "ledger could not see them" in in_time.diagnosis  # right gradients, nothing seen kept, nothing rebuilt
    rebuilt = P2.in_time_check(obs, p2_budget("gathered in time"), K, (True, True, False))
    assert "rebuilt from x" in rebuilt.diagnosis
    wrong = P2.in_time_check(obs, p2_budget("gathered in time"), K, (False, True, True))
    assert wrong.diagnosis == ""  # wrong gradients: no guess where checkpoints came from


def test_rows_gathered_by_any_call_count_and_all_of_them_up_front_is_late():
    """Receives of each rank's rows count as gathering, as an all-gather does: all L/k checkpoints received before
    the first segment's backward is all of them up front. Each checkpoint received right before its segment is
    in time. Gradient all-reduces (sums over buffers that are not whole [B, d] checkpoints) do not count."""
    rows = C // N
    up_front = [event(0, "comm", "recv", t, t + 1, nbytes=rows, peers=(src, 0))
                for t, src in enumerate(s for _ in range(L // K) for s in (1, 2, 3))]
    segment = [event(0, "compute", "backward", 100 + 10 * i, 110 + 10 * i, flops=10 ** 12) for i in range(L // K)]
    obs = observation(up_front + segment, [{"held_at_gathers": [C]}] * N, N)
    check = P2.in_time_check(obs, p2_budget("gathered in time"), K, RIGHT)
    assert not check.passed and "gathered them all up front" in check.diagnosis
    in_time = [event(0, "comm", "recv", 100 + 10 * i, 101 + 10 * i, nbytes=rows, peers=(src, 0))
               for i in range(L // K) for src in (1, 2, 3)]
    gradients = [event(0, "comm", "all_reduce", 50, 51, nbytes=C // 2, peers=(0, 1, 2, 3))] * 8
    ranks = [observation(in_time + gradients + segment, [{"held_at_gathers": [C]}] * N, N)]
    assert P2.in_time_check(ranks[0], p2_budget("gathered in time"), K, RIGHT).passed is False  # only rank 0 did
    everyone = [dict(e, rank=r, peers=(e["peers"][0], r) if e["kind"] == "recv" else e["peers"])
                for r in range(N) for e in in_time + gradients + segment]
    assert P2.in_time_check(observation(everyone, [{"held_at_gathers": [C]}] * N, N),
                            p2_budget("gathered in time"), K, RIGHT).passed


# ---- p15: who sent to whom

P15 = SPECS["p15"]


def ring_sends(step_to, phase, blocks):
    """Every rank sends `blocks` K/V-block-sized messages in `phase`, the i-th to rank step_to(rank, i)."""
    from grader.specs.p15_ring_attention.serial import KV, N as WORLD
    out = []
    for r in range(WORLD):
        for i in range(blocks):
            e = event(r, "comm", "send", i, i + 1, nbytes=KV // 2, peers=(r, step_to(r, i) % WORLD))
            e["phase"] = phase
            out += [e, dict(e)]  # K and V apart
    return out


def test_blocks_go_round_the_ring_in_forward_whatever_the_direction():
    from grader.specs.p15_ring_attention.checks import phase_communication_check
    from grader.specs.p15_ring_attention.serial import N as WORLD
    budget = P15.budgets(P15.make_inputs(0))["forward communication"]
    for turn in (1, -1):  # right or left: a ring either way
        obs = observation(ring_sends(lambda r, i: r + turn, "forward", WORLD - 1), [{}] * WORLD, WORLD)
        assert phase_communication_check(obs, budget, "forward", True).passed
    straight = observation(ring_sends(lambda r, i: r + i + 1, "forward", WORLD - 1), [{}] * WORLD, WORLD)
    check = phase_communication_check(straight, budget, "forward", True)
    assert not check.passed and "not its ring neighbours" in check.diagnosis, check.message


def test_in_backward_the_dkdv_may_go_home_but_not_the_kv_blocks_too():
    from grader.specs.p15_ring_attention.checks import phase_communication_check
    from grader.specs.p15_ring_attention.serial import N as WORLD
    budget = P15.budgets(P15.make_inputs(0))["backward communication"]
    kv_ring = ring_sends(lambda r, i: r + 1, "backward", WORLD - 1)
    home = ring_sends(lambda r, i: r - i - 1, "backward", WORLD - 1)  # each dK/dV part straight to its owner
    obs = observation(kv_ring + home, [{}] * WORLD, WORLD)
    assert phase_communication_check(obs, budget, "backward", True).passed
    far = ring_sends(lambda r, i: r + 2, "backward", 2 * (WORLD - 1))  # the right bytes, none round the ring
    check = phase_communication_check(observation(far, [{}] * WORLD, WORLD), budget, "backward", True)
    assert not check.passed and "within the budget" in check.message and "not its ring neighbours" in check.diagnosis


# ---- pipelines: the schedule read off the messages

def test_a_relay_needs_its_products_between_each_input_and_the_outputs_after_it():
    """Each output needs an input that arrived before it and a unit of products after that arrival, whatever order
    the rank ran its units in; products computed before the inputs arrived (padding at tick 0) pay for nothing."""
    from grader.core.schedule import Relay, shortfall
    relay = Relay("forward", (10, 20), (15, 30), 100, ("activation in", "activation out"))

    def obs(*spans):
        return observation([event(0, "compute", "forward", a, b, flops=f) for a, b, f in spans], [{}], 1)

    assert shortfall(obs((10, 15, 100), (20, 30, 100)), 0, relay) is None
    assert shortfall(obs((10, 30, 200)), 0, relay) is None  # one event for both: cut pro rata
    padded = shortfall(obs((0, 10, 10 ** 6)), 0, relay)
    assert padded is not None and padded.output == 1 and padded.found == 0
    assert "its 1st activation out at tick 15" in padded.describe()
    late = shortfall(obs((10, 15, 100), (16, 19, 100)), 0, relay)  # the second unit ran before its input came
    assert late is not None and late.output == 2 and late.start == 20


def test_a_pipeline_refuses_a_makespan_below_the_critical_paths_work():
    """With every stage's messages and products where they belong but the step shorter than the products of the
    chain at the peak rate, the bubble check fails: no schedule on the clock is that short."""
    spec = SPECS["p5"]
    budget = spec.budgets(spec.make_inputs(0))["bubble"]
    quick = observation([event(r, "compute", "forward", 0, 100, flops=10 ** 6) for r in range(4)], [{}] * 4, 4)
    check = spec.bubble_check(quick, budget, values_right=True)
    assert not check.passed and "less than the critical path's work" in check.message
    assert "neither timed nor counted" in check.diagnosis
    assert spec.bubble_check(quick, budget, values_right=False).diagnosis == ""


def test_a_bubble_is_never_below_zero():
    """A last stage whose own compute is less than the formula's work (a cheaper style) has its bubble read
    against its own compute, so a figure below zero cannot be reported; above the critical path's floor."""
    spec = SPECS["p5"]
    budget = spec.budgets(spec.make_inputs(0))["bubble"]
    busy = [event(r, "compute", "forward", 1000, 30_000, flops=10 ** 9) for r in range(4)]  # W is 32,920
    check = spec.bubble_check(observation(busy, [{}] * 4, 4), budget)  # 1 - W/makespan would be -9.7%
    assert check.passed and abs(check.measured - 1000 / 30_000) < 1e-6 and "its own compute" in check.message
