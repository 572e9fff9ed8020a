"""p9: the serial truth is torch's own (GradScaler and Adam), the inputs overflow at step 4 and nowhere else
whatever the seed, the hand-written replay sits well inside the tolerance and every mistake it replays well
outside, the reference holds exactly 16 bytes per weight, and the optimizer-state walk finds m and v wherever an
answer keeps them. Also: the notebook opens Part II before puzzle 9."""

import pytest
import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe
from grader.frontends.notebooks.file import build_notebook
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p9_mixed_precision import serial
from grader.specs.p9_mixed_precision import spec as p9
from grader.specs.common.optimizer_state import changes, snapshot, state_tensors
from puzzles.model import forward, loss_fn

SPEC = SPECS["p9"]


def largest_difference(a_steps, b_steps) -> float:
    return max((x.double() - y.double()).abs().max().item()
               for a, b in zip(a_steps, b_steps) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_the_overflow_is_at_step_4_and_nowhere_else(seed):
    ref = serial.torch_reference(serial.make_inputs(seed))  # raises if another step overflows
    assert ref["overflows"] == [False, False, False, True, False, False]
    assert ref["scales"] == serial.EXPECTED_SCALES == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 2048.0]


@pytest.mark.parametrize("seed", [0, 5, 11])
def test_the_replay_is_within_the_tolerance_and_every_mistake_far_outside_it(seed):
    """Each against the reference forced onto its own masters, as the grader compares (bench/bench_part_two.py
    has the figures over 1,000 seeds)."""
    inputs = serial.make_inputs(seed)
    got = serial.replay(inputs)
    assert largest_difference(got, serial.forced_expectation(inputs, got)) < serial.TOLERANCE / 10
    for mistake, knobs in serial.MISTAKES.items():
        got = serial.replay(inputs, **knobs)
        assert largest_difference(got, serial.forced_expectation(inputs, got)) > 10 * serial.TOLERANCE, mistake


def grad_scaler_reference(inputs) -> dict:
    """The reference as it was before torch 2.2 was supported: torch.amp.GradScaler itself deciding each step."""
    masters = [w.detach().clone().requires_grad_() for pair in inputs["layers"] for w in pair]
    adam = torch.optim.Adam(masters, lr=serial.LR, betas=serial.BETAS, eps=serial.EPS, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=serial.INIT_SCALE, growth_factor=serial.GROWTH,
                                  backoff_factor=serial.BACKOFF, growth_interval=serial.GROWTH_INTERVAL)
    weights, scales = [], []
    for x, target in zip(inputs["xs"], inputs["targets"]):
        half = [w.detach().half().requires_grad_() for w in masters]
        scaler.scale(loss_fn(forward(x, list(zip(half[::2], half[1::2]))).float(), target)).backward()
        for m, h in zip(masters, half):
            m.grad = h.grad.float()
        scaler.unscale_(adam)
        scaler.step(adam)
        scaler.update()
        adam.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
        weights.append([(w1.detach().clone(), w2.detach().clone()) for w1, w2 in zip(masters[::2], masters[1::2])])
    return {"weights": weights, "scales": scales}


@pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason="torch.amp.GradScaler came in torch 2.3")
@pytest.mark.parametrize("seed", [0, 7])
def test_the_written_out_scaler_is_torchs_grad_scaler_bit_for_bit(seed):
    """The reference writes GradScaler's loss scaling out (so that torch 2.2 grades p9); wherever torch has
    torch.amp.GradScaler, the two give the same weights, to the bit, and the same scales, the overflow included."""
    inputs = serial.make_inputs(seed)
    ours, torchs = serial.torch_reference(inputs), grad_scaler_reference(inputs)
    assert ours["scales"] == torchs["scales"]
    for step, (a, b) in enumerate(zip(ours["weights"], torchs["weights"], strict=True), 1):
        assert all(torch.equal(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb)), \
            f"step {step}: largest difference {largest_difference([a], [b])}"


def test_forcing_changes_nothing_for_the_reference_itself():
    inputs = serial.make_inputs(2)
    ref = serial.torch_reference(inputs)["weights"]
    assert largest_difference(serial.forced_expectation(inputs, ref), ref) == 0


def test_the_reference_holds_exactly_16_bytes_per_weight():
    module = load_module(REPO / "solutions" / SPEC.filename)
    obs = observe(SPEC, module, SPEC.make_inputs(0), 0)
    assert obs.results[0]["parameter_bytes"] == 16 * serial.PSI == p9.PARAMETER_BYTES == 131072
    assert obs.results[0]["activation_bytes"] > 0  # measured apart


class _Holder:
    def __init__(self, params):
        self.adam = torch.optim.Adam(params, lr=0.1)
        self.flat = torch.zeros(6)
        self.counter = torch.zeros(())  # one number: left out


def test_the_state_walk_finds_torch_adams_moments_and_sees_them_change():
    params = [torch.ones(2, 3, requires_grad=True)]
    holder = _Holder(params)
    params[0].grad = torch.ones(2, 3)
    holder.adam.step()
    paths = [p for p, _ in state_tensors(holder)]
    assert any("exp_avg'" in p for p in paths) and any("exp_avg_sq" in p for p in paths)
    assert "opt.flat" in paths and "opt.counter" not in paths
    before = snapshot(holder, {"w": params[0]})
    assert changes(before, holder, {"w": params[0]}) == []
    holder.adam.step()  # the same gradient again: m, v and the weight all move
    changed = {c["path"] for c in changes(before, holder, {"w": params[0]})}
    assert "w" in changed and any("exp_avg'" in p for p in changed)


@pytest.mark.parametrize("scales", [None, "not a scale", [], [1024.0], [float("nan")] * 6])
def test_odd_scales_fail_the_loss_scale_check_without_crashing(scales):
    check = p9.MixedPrecision.check_scales({"scales": scales})
    assert not check.passed and isinstance(check.diagnosis, str)


@pytest.mark.parametrize("weights", [None, [], [[(None, None)]] * 6, [[("x", 1)]] * 6])
def test_odd_weights_fail_the_weights_check_without_crashing(weights):
    inputs = SPEC.make_inputs(0)
    ref = SPEC.reference(inputs)
    [check] = [c for c in SPEC.check(odd_observation(weights), ref, inputs) if c.name == "weights after each step"]
    assert not check.passed and "step 1" in check.message


def odd_observation(weights):
    module = load_module(REPO / "solutions" / SPEC.filename)
    obs = observe(SPEC, module, SPEC.make_inputs(0), 0)
    obs.results = [{**obs.results[0], "weights": weights}]
    return obs


def test_the_notebook_opens_part_two_before_puzzle_9():
    ids = [c.get("id") for c in build_notebook(REPO).cells]
    assert ids.index("part-1") < ids.index("p1-story") < ids.index("p8-check") < ids.index("part-2") \
        < ids.index("p9-story")
    part_two = build_notebook(REPO).cells[ids.index("part-2")].source
    assert part_two.startswith("# Part II") and "16 bytes per parameter" in part_two


def test_the_readme_row_states_the_budget_and_the_scales():
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| p9 |"))
    assert "131,072" in row and ", ".join(f"{s:,.0f}" for s in serial.EXPECTED_SCALES) in row
