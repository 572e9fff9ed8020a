"""No answer may crash the grader: every check and every diagnosis reads whatever an answer handed back. Each
case takes a real run of the reference solution, replaces one thing the learner's code controls (a returned
tensor, a gradient left in .grad, the weights it updated) by something odd, and grades that: None, a string, a
list, a tensor of another shape or dtype, NaN, a wrong value of the right shape, a list of the wrong length. The
check that reads it must fail, say where, and nothing may raise."""

import copy

import pytest
import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe
from grader.core.grading import one_thread
from grader.frontends.targets import REPO
from grader.specs import SPECS

# What each puzzle's program returns that the learner's code controls: a path into one rank's result, and the
# value check that reads it.
FIELDS = {
    "p1": [(("y",), "output"), (("grad_x",), "gradients"), (("grads", 3, 0), "gradients"), (("grads",), "gradients")],
    "p2": [(("y",), "output"), (("grad_x",), "gradients"), (("grads", 0, 1), "gradients")],
    "p3": [(("layers", 1, 0), "updated weights"), (("layers",), "updated weights"),
           (("grads", 0, 0), None), (("grads",), None)],
    "p4": [(("y",), "output"), (("x_grad",), "input gradient"), (("grads", 2, 1), "weight gradients"),
           (("grads",), "weight gradients")],
    "p5": [(("input_grad",), "input gradients"), (("grads", 1, 0), "stage gradients"), (("grads",), "stage gradients")],
    "p6": [(("input_grad",), "input gradients"), (("grads", 0, 1), "stage gradients")],
    "p7": [(("layers", 3, 1), "updated weights"), (("grads", 2, 1), None)],
    "p8": [(("layers", 0, 1), "weights after k steps"), (("layers",), "weights after k steps")],
    "p16": [(("input_grads", 0), "input gradients"), (("input_grads", 1), "input gradients"),
            (("grads", 1, 0, 1), "chunk gradients"), (("grads",), "chunk gradients")],
    "p17": [(("input_grad",), "input gradients"), (("grads", 1, 0), "stage gradients")],
    "p13": [(("t", 0), "ring values"), (("t", 7), "doubling values")],
    "p15": [(("y",), "output"), (("x_grad",), "input gradient"), (("wqkv_grad",), "q/k/v gradients"),
            (("wo_grad",), "output projection gradient")],
}

TENSOR_VARIANTS = {
    "None": lambda t: None,
    "a string": lambda t: "not a tensor",
    "a list": lambda t: [t],
    "another shape": lambda t: t.reshape(-1)[:3].clone(),
    "another dtype": lambda t: t.float(),
    "NaN": lambda t: torch.full_like(t, float("nan")),
    "a wrong value": lambda t: t + 1,
    "zeros": lambda t: torch.zeros_like(t),
    "scaled": lambda t: 3 * t,
}
LIST_VARIANTS = {
    "None": lambda v: None,
    "empty": lambda v: [],
    "one short": lambda v: v[:-1],
    "all None": lambda v: [None] * len(v),
    "not pairs": lambda v: [p[0] if isinstance(p, (tuple, list)) else p for p in v],
    "a tensor": lambda v: torch.zeros(3),
}

_OBSERVED = {}


def observed(puzzle):
    """The reference's observation, inputs and serial reference for one puzzle (made once)."""
    if puzzle not in _OBSERVED:
        spec = SPECS[puzzle]
        inputs = spec.make_inputs(0)
        obs = observe(spec, load_module(REPO / "solutions" / spec.filename), inputs, 0)
        _OBSERVED[puzzle] = (obs, inputs, spec.reference(inputs))
    return _OBSERVED[puzzle]


def replaced(value, path, change):
    """A copy of `value` with the item at `path` replaced by change(item); tuples are rebuilt as tuples."""
    if not path:
        return change(value)
    head, rest = path[0], path[1:]
    items = list(value)
    items[head] = replaced(items[head], rest, change)
    return tuple(items) if isinstance(value, tuple) else items


def cases():
    for puzzle, fields in FIELDS.items():
        for path, check in fields:
            is_list = path[-1] in ("grads", "layers")
            for name in (LIST_VARIANTS if is_list else TENSOR_VARIANTS):
                yield pytest.param(puzzle, path, check, name, id=f"{puzzle}-{'.'.join(map(str, path))}-{name}")


@pytest.mark.parametrize("puzzle, path, check, variant", list(cases()))
def test_an_odd_answer_fails_its_check_and_crashes_nothing(puzzle, path, check, variant):
    spec = SPECS[puzzle]
    obs, inputs, ref = observed(puzzle)
    odd = copy.copy(obs)
    odd.results = list(obs.results)
    rank = len(odd.results) - 1  # the last rank: the last stage of a pipeline
    change = (LIST_VARIANTS if path[-1] in ("grads", "layers") else TENSOR_VARIANTS)[variant]
    odd.results[rank] = {**obs.results[rank], path[0]: replaced(obs.results[rank][path[0]], path[1:], change)}
    with one_thread():  # as the grader runs it
        checks = {c.name: c for c in spec.check(odd, ref, inputs)}  # must not raise
    for c in checks.values():
        assert isinstance(c.message, str) and isinstance(c.diagnosis, str)
    if check is None:  # what the grader reads only as evidence for a diagnosis (p3, p7: w.grad after the step)
        return
    assert not checks[check].passed, f"{check} passed with {variant} at {path}: {checks[check].message}"
    assert f"rank {rank}" in checks[check].message or puzzle == "p1", checks[check].message
