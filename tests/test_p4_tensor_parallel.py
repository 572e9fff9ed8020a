"""p4 beyond the generic tests: other correct ways to write f and g pass; the replayed mistakes are faithful (the
replay of the right f and g is the serial reference); the mistakes without a file under tests/wrong are named;
the memory budget separates the reference from the naive answer by a wide margin."""

import textwrap

import pytest

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_file, observe
from grader.core.result import FAIL, PASS
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p4_tensor_parallel import mistakes as p4

SPEC = SPECS["p4"]

TEMPLATE = '''
import torch
import torch.nn.functional as F


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
{f_forward}

    @staticmethod
    def backward(ctx, grad):
{f_backward}


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        ctx.dist = dist
{g_forward}

    @staticmethod
    def backward(ctx, grad):
{g_backward}


def tp_forward(dist, x, shards):
    for w1, w2 in shards:
{block}
    return x
'''

RIGHT = {
    "f_forward": "return x",
    "f_backward": "grad = grad.clone()\nctx.dist.all_reduce(grad)\nreturn grad, None",
    "g_forward": "total = partial.clone()\ndist.all_reduce(total)\nreturn total",
    "g_backward": "return grad, None",
    "block": "x = x + ReduceFromTensorParallel.apply(F.gelu(CopyToTensorParallel.apply(x, dist) @ w1) @ w2, dist)",
}


def answer(tmp_path, **changes):
    parts = {**RIGHT, **changes}
    indent = {k: 8 for k in parts}
    source = TEMPLATE.format(**{k: textwrap.indent(v, " " * indent[k]) for k, v in parts.items()})
    (tmp_path / SPEC.filename).write_text(source)
    return grade_file(SPEC, tmp_path / SPEC.filename, seed=5)


@pytest.mark.parametrize("changes", [
    {},
    # Megatron's way: all-reduce in place, on the tensors handed in
    {"f_backward": "ctx.dist.all_reduce(grad)\nreturn grad, None",
     "g_forward": "dist.all_reduce(partial)\nreturn partial"},
    {"f_forward": "return x.clone()"},
    {"g_forward": "total = partial.clone()\ndist.all_reduce(total, op=dist.ReduceOp.SUM)\nreturn total",
     "block": "h = F.gelu(F.linear(CopyToTensorParallel.apply(x, dist), w1.t()))\n"
              "x = x + ReduceFromTensorParallel.apply(F.linear(h, w2.t()), dist)"},
], ids=["template", "in_place", "f_clones", "linear"])
def test_other_correct_answers_pass(tmp_path, changes):
    result = answer(tmp_path, **changes)
    assert result.status == PASS, [(c.name, c.message) for c in result.failed_checks()]


@pytest.mark.parametrize("changes, failures, phrase", [
    ({"g_forward": "total = partial.clone()\ndist.all_reduce(total)\ndist.all_reduce(total)\nreturn total"},
     {"output", "input gradient", "weight gradients", "forward communication"}, "all-reduced twice"),
    ({"f_backward": "grad = grad.clone()\nctx.dist.all_reduce(grad, op=ctx.dist.ReduceOp.AVG)\nreturn grad, None"},
     {"input gradient", "weight gradients"}, "f's backward averaged"),
])
def test_more_mistakes_are_named(tmp_path, changes, failures, phrase):
    result = answer(tmp_path, **changes)
    assert result.status == FAIL
    failed = {c.name: c for c in result.failed_checks()}
    assert set(failed) == failures, [(c.name, c.message, c.diagnosis) for c in failed.values()]
    assert any(phrase in c.diagnosis for c in failed.values()), [c.diagnosis for c in failed.values()]


def test_replay_of_the_right_f_and_g_is_the_serial_reference():
    inputs = SPEC.make_inputs(2)
    ref = SPEC.reference(inputs)
    replayed = p4.replay(inputs, (p4.ID, p4.SUM), (p4.SUM, p4.ID))
    for rank, got in enumerate(replayed):
        assert p4.matches(got, {**ref, "grads": ref["grads"][rank]}, ["y", "x_grad", "grads"])


def test_every_replayed_mistake_differs_from_the_reference_and_from_the_others():
    inputs = SPEC.make_inputs(2)
    ref = SPEC.reference(inputs)
    models = p4.Models(inputs)
    names = list(p4.FORWARD_MISTAKES) + list(p4.BACKWARD_MISTAKES)
    for name in names:
        got = models.get(name)[0]
        assert not p4.matches(got, {**ref, "grads": ref["grads"][0]}, ["y", "x_grad", "grads"]), name
        for other in names:
            if other != name:
                assert not p4.matches(got, models.get(other)[0], ["y", "x_grad", "grads"]), (name, other)


def test_memory_budget_margins():
    """The reference sits well inside the budget and the naive answer (full weights) far outside it."""
    inputs = SPEC.make_inputs(0)
    budget = SPEC.budgets(inputs)["peak memory"].value
    reference = observe(SPEC, load_module(REPO / "solutions" / SPEC.filename), inputs, 0)
    naive = observe(SPEC, load_module(REPO / "tests" / "naive" / SPEC.filename), inputs, 0)
    assert max(reference.peak_bytes) <= 0.85 * budget
    assert min(naive.peak_bytes) >= 2 * budget
