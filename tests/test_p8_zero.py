"""p8: the diagnostic serial Adam is torch.optim.Adam's arithmetic; ZeRO-2's per-rank optimizer state equals the
formula K·Ψ/N exactly. (A sharded Adam without a master copy, and torch.optim.Adam on a shard, are in
tests/alternatives/.)"""

import torch

from grader.backends.learner_code import load_module
from grader.core.compare import REL_TOL
from grader.backends.simulator import observe
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p8_zero import spec as p8

SPEC = SPECS["p8"]


def test_serial_adam_is_torch_adam():
    inputs = SPEC.make_inputs(4)
    ours = p8.adam_serial(inputs["layers"], inputs["batches"], p8.LR, p8.BETAS, p8.EPS)
    theirs = p8.torch_adam(inputs["layers"], inputs["batches"], p8.LR, p8.BETAS, p8.EPS)
    for a, b in zip(ours, theirs):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-14)


def test_zero2_optimizer_state_equals_the_formula_exactly():
    module = load_module(REPO / "solutions" / SPEC.filename)
    obs = observe(SPEC, module, SPEC.make_inputs(0), 0)
    assert [r["state_bytes"] for r in obs.results] == [24 * p8.PSI // p8.N] * p8.N == [49152] * 4


def test_every_replayed_mistake_is_far_from_the_reference():
    """A replay that matched torch's Adam would name a mistake in a right answer: each must differ from it by more
    than the weights' tolerance."""
    inputs = SPEC.make_inputs(4)
    right = p8.flat(p8.torch_adam(inputs["layers"], inputs["batches"], p8.LR, p8.BETAS, p8.EPS))
    for knobs, _ in p8.REPLAYED:
        wrong = p8.flat(p8.adam_serial(inputs["layers"], inputs["batches"], p8.LR, p8.BETAS, p8.EPS, **knobs))
        assert (wrong - right).abs().max() > 10 * REL_TOL * max(1.0, right.abs().max().item()), knobs


def test_the_master_shard_is_found_at_its_offset_on_every_rank():
    module = load_module(REPO / "solutions" / SPEC.filename)
    obs = observe(SPEC, module, SPEC.make_inputs(0), 0)
    assert [[f["offset"] for f in r["master_at_start"]] for r in obs.results] == [[r * p8.SHARD] for r in range(p8.N)]
