"""p10: the reference meets ZeRO-3's formulas to the byte and the tick (two layers gathered, 3·(N-1)/N·8Ψ sent,
compute plus one gather and one reduce-scatter), the given block backward is autograd's, the gather watch counts
a storage once whatever views are held and lets it go when it dies, and the diagnosis reads the gathered layers."""

import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe
from grader.core.rules import sent
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p10_fsdp import spec as p10
from grader.specs.p10_fsdp.gathered_weights import watched
from puzzles import sim
from puzzles.model import block

SPEC = SPECS["p10"]


def reference_observation(seed=0):
    module = load_module(REPO / "solutions" / SPEC.filename)
    return observe(SPEC, module, SPEC.make_inputs(seed), seed)


def test_the_reference_meets_the_zero3_formulas_exactly():
    obs = reference_observation()
    for r in range(p10.N):
        held = obs.results[r]["held"]
        assert max(h["gathered"] for h in held) == p10.SHARDS + 2 * p10.W == 786432
        assert sum(b for _, b in sent(obs, r).values()) == p10.ZERO3_BYTES == 3 * p10.DATA_PARALLEL_BYTES // 2
    assert [obs.busy_ticks(r) for r in range(p10.N)] == [p10.compute_ticks()] * p10.N
    assert obs.makespan == p10.compute_ticks() + 2 * p10.gather_ticks() == 5659 + 432


def test_the_budgets_count_the_helpers_the_puzzle_gives():
    """The spec measures its compute on copies of forward_keeping_activations and backward_from_activations: they
    must be the puzzle's own, line for line."""
    import ast
    import inspect

    solution = load_module(REPO / "solutions" / SPEC.filename)
    for given, counted in ((solution.forward_keeping_activations, p10._layer_forward),
                           (solution.backward_from_activations, p10._layer_backward)):
        body = [ast.dump(node) for node in ast.parse(inspect.getsource(given)).body[0].body[1:]]
        assert body == [ast.dump(node) for node in ast.parse(inspect.getsource(counted)).body[0].body[1:]], given


def test_the_given_block_backward_is_autograds():
    solution = load_module(REPO / "solutions" / SPEC.filename)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 64, generator=g, dtype=torch.float64, requires_grad=True)
    w1 = torch.randn(64, 256, generator=g, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(256, 64, generator=g, dtype=torch.float64, requires_grad=True)
    grad_y = torch.randn(4, 64, generator=g, dtype=torch.float64)
    block(x, w1, w2).backward(grad_y)
    y, saved = solution.forward_keeping_activations(x.detach(), w1.detach(), w2.detach())
    torch.testing.assert_close(y, block(x, w1, w2).detach(), rtol=0, atol=1e-12)
    for got, expected in zip(solution.backward_from_activations(saved, w1.detach(), w2.detach(), grad_y),
                             (x.grad, w1.grad, w2.grad)):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_the_watch_counts_a_gathered_storage_once_forgets_it_when_it_dies_and_ends_the_forward_on_a_gradient():
    def program(dist):
        shard = torch.ones(4, dtype=torch.float64)
        watch, records = watched(dist, [shard], layer_bytes=128)
        full = torch.empty(16, dtype=torch.float64)
        watch.all_gather_into_tensor(full, shard)
        views = full[:8], full[8:]  # views: the same storage
        watch.barrier()
        del full, views
        watch.all_reduce(torch.zeros(4, dtype=torch.float64))  # too small to be a layer's gradient
        watch.all_reduce(torch.zeros(16, dtype=torch.float64))  # a layer's worth: the backward has begun
        assert not hasattr(watch, "_dist") and not vars(type(watch)).get("__dict__")
        return [(h["gathered"], h["forward"]) for h in records.held]

    result = sim.run(program, world_size=4)
    assert result.results[0] == [(32 + 128, True), (32 + 128, True), (32, True), (32, False)]


def test_gathering_everything_at_once_is_named():
    counts = [p10.L, p10.L, p10.L]
    assert "all 4 layers were gathered at the first collective" in p10.Fsdp.diagnose_gathered(counts)
    assert "kept after its forward" in p10.Fsdp.diagnose_gathered([1, 2, 3, 4, 4, 3])
    assert p10.Fsdp.diagnose_gathered([1, 2, 2, 5]) == ""  # nothing singles a mistake out


ODD = {"None": lambda t: None, "a string": lambda t: "shard", "a list": lambda t: [t], "float32": lambda t: t.float(),
       "NaN": lambda t: torch.full_like(t, float("nan")), "another shape": lambda t: t[:5].clone(),
       "a wrong value": lambda t: t + 1}


def test_odd_shards_fail_the_weights_check_and_crash_nothing():
    obs = reference_observation()
    inputs = SPEC.make_inputs(0)
    ref = SPEC.reference(inputs)
    for name, change in ODD.items():
        odd = [dict(res) for res in obs.results]
        odd[3]["shards"] = [change(s) if i == 2 else s for i, s in enumerate(odd[3]["shards"])]
        obs_odd = type(obs)(**{**obs.__dict__, "results": odd})
        checks = {c.name: c for c in SPEC.check(obs_odd, ref, inputs)}
        values = checks["weights after the step"]
        assert not values.passed and "rank 3: shards[2]" in values.message, name
        assert "could not work out" not in values.diagnosis, (name, values.diagnosis)
    short = [dict(res) for res in obs.results]
    short[1]["shards"] = short[1]["shards"][:-1]
    check = SPEC.check(type(obs)(**{**obs.__dict__, "results": short}), ref, inputs)[0]
    assert not check.passed and "rank 1: shards[3]" in check.message


def test_the_readme_row_states_every_budget():
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| p10 |"))
    for budget in SPEC.budgets(SPEC.make_inputs(0)).values():
        assert f"{budget.value:,}" in row, budget.name
