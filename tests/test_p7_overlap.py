"""p7's cost model does what its text says: the compute budget is exactly the compute the step does, the stated
all-reduce costs are the simulator's, and an overlap with other bucket sizes (one bucket per block) also passes."""

import ast
import types

import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_module, observe
from grader.core.result import PASS
from grader.frontends.targets import REPO, grade_target
from grader.specs import SPECS
from grader.specs import p7_overlap as p7
from puzzles.model import forward, loss_fn

SPEC = SPECS["p7"]


def text():
    return ast.get_docstring(ast.parse((REPO / "solutions" / SPEC.filename).read_text()))


def test_stated_costs_are_the_simulators():
    assert (p7.compute_ticks(), p7.block_all_reduce_ticks(), p7.weight_all_reduce_ticks()) == (5888, 816, 432)
    for figure in ("5,888", "816", "432", "6,998", "9,344", "1,024", "512", "alpha = 8"):
        assert figure in text(), figure
    # every matmul's FLOPs is a whole number of ticks, so the compute budget is exact
    assert (2 * p7.ROWS * p7.D * p7.H) % p7.COST.flops_per_tick == 0


def test_reference_computes_exactly_the_compute_budget_and_hides_all_but_the_tail():
    [result] = grade_target("solutions", ["p7"], seed=0)
    assert result.status == PASS
    inputs = SPEC.make_inputs(0)
    module = load_module(REPO / "solutions" / SPEC.filename)
    obs = observe(SPEC, module, inputs, 0)
    assert [obs.busy_ticks(r) for r in range(p7.N)] == [p7.compute_ticks()] * p7.N
    assert obs.makespan - p7.compute_ticks() < p7.block_all_reduce_ticks()


def test_naive_takes_compute_plus_all_communication():
    module = load_module(REPO / "tests" / "naive" / SPEC.filename)
    obs = observe(SPEC, module, SPEC.make_inputs(0), 0)
    assert obs.makespan == p7.compute_ticks() + 2 * p7.L * p7.weight_all_reduce_ticks() == 9344


def bucketed_step(dist, x_shard, target_shard, layers, lr):
    """One flat bucket per block, launched when the block's last gradient (w1's) is ready."""
    pending = []

    def launch(w):
        w1, w2 = next(pair for pair in layers if pair[0] is w)
        bucket = torch.cat([w1.grad.reshape(-1), w2.grad.reshape(-1)])
        pending.append((dist.all_reduce(bucket, async_op=True), bucket, w1, w2))

    hooks = [w1.register_post_accumulate_grad_hook(launch) for w1, _ in layers]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    world = dist.get_world_size()
    with torch.no_grad():
        for work, bucket, w1, w2 in pending:
            work.wait()
            w1 -= lr / world * bucket[: w1.numel()].view_as(w1)
            w2 -= lr / world * bucket[w1.numel():].view_as(w2)
    for h in hooks:
        h.remove()


def test_one_bucket_per_block_passes_too():
    result = grade_module(SPEC, types.SimpleNamespace(overlapped_step=bucketed_step), seed=5)
    assert result.status == PASS, [c.message for c in result.checks]
