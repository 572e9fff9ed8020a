"""p8: the diagnostic serial Adam is torch.optim.Adam's arithmetic; ZeRO-2's per-rank optimizer state equals the
formula K·Ψ/N exactly; a sharded Adam without a master copy (16·Ψ/N) passes as well."""

import types

import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_module, observe
from grader.core.result import PASS
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs import p8_zero as p8

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


class AdamWithoutMaster:
    """ZeRO-2 keeping only m and v for the shard; the shard of the weights is read off the weights each step."""

    def __init__(self, dist, layers, lr, betas, eps):
        self.dist, self.lr, self.betas, self.eps, self.t = dist, lr, betas, eps, 0
        self.weights = [w for pair in layers for w in pair]
        n = sum(w.numel() for w in self.weights)
        self.shard = n // dist.get_world_size()
        self.lo = dist.get_rank() * self.shard
        self.m = torch.zeros(self.shard, dtype=torch.float64)
        self.v = torch.zeros(self.shard, dtype=torch.float64)

    def step(self):
        b1, b2 = self.betas
        self.t += 1
        with torch.no_grad():
            flat = torch.cat([w.grad.reshape(-1) for w in self.weights])
            g = torch.empty(self.shard, dtype=torch.float64)
            self.dist.reduce_scatter_tensor(g, flat, op=self.dist.ReduceOp.AVG)
            self.m.mul_(b1).add_(g, alpha=1 - b1)
            self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
            flat = torch.cat([w.reshape(-1) for w in self.weights])
            shard = flat[self.lo:self.lo + self.shard].clone()
            shard.addcdiv_(self.m, (self.v / (1 - b2 ** self.t)).sqrt() + self.eps, value=-self.lr / (1 - b1 ** self.t))
            self.dist.all_gather_into_tensor(flat, shard)
            offset = 0
            for w in self.weights:
                w.copy_(flat[offset:offset + w.numel()].view_as(w))
                offset += w.numel()


def test_sharded_adam_without_master_copy_passes():
    result = grade_module(SPEC, types.SimpleNamespace(ShardedAdam=AdamWithoutMaster), seed=2)
    assert result.status == PASS, [c.message for c in result.checks]
    state = next(c for c in result.checks if c.name == "optimizer state")
    assert state.measured == 16 * p8.PSI // p8.N
