"""The likely cause appended to a plain error (grader/backends/error_causes.py): named for the errors whose message
and line single one mistake out, and for nothing else. The wrong answers in tests/wrong/ that err hold the whole
path (p1_inference_mode_forward, p3_update_without_no_grad, p5_received_without_requires_grad,
p8_step_count_from_zero; p19's ranks that decide apart: p19_norm_of_own_shard_diverges,
p19_norm_over_the_pair_diverges, p19_skip_before_the_norm_all_reduce)."""

import pytest
import torch

from puzzles import sim

from grader.backends.error_causes import likely_cause
from grader.backends.learner_code import describe_exception


def raised(fn) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the point is to catch what torch raises
        return exc
    raise AssertionError("no error")


def in_place_on_a_leaf():
    w = torch.ones(2, requires_grad=True)
    w -= 1


def inference_tensor_into_autograd():
    with torch.inference_mode():
        t = torch.ones(2)
    t.requires_grad_()


def cat_of_none():
    torch.cat([None])


def bias_correction_at_step_zero():
    beta1, t = 0.9, 0
    return 0.01 / (1 - beta1 ** t)


@pytest.mark.parametrize("fn, line, phrase", [
    (in_place_on_a_leaf, "w -= lr * w.grad", "torch.no_grad()"),
    (inference_tensor_into_autograd, "start = saved[s].detach().requires_grad_()", "torch.inference_mode()"),
    (cat_of_none, "return torch.cat(input_grads)", "a.requires_grad_()"),
    (bias_correction_at_step_zero, "value=-self.lr / (1 - beta1 ** self.t)", "t = 1 at the first step"),
])
def test_an_error_that_singles_out_a_mistake_names_it(fn, line, phrase):
    assert phrase in likely_cause(raised(fn), line)


@pytest.mark.parametrize("fn, line", [
    (cat_of_none, "return torch.cat(outputs)"),  # a None, but nothing says it is a gradient
    (bias_correction_at_step_zero, "share = total / count"),  # a division by zero, but not Adam's
    (lambda: torch.ones(2) @ torch.ones(3), "y = x @ w"),
    (lambda: [][0], "grad = grads[0]"),
])
def test_an_error_that_does_not_single_out_a_mistake_gets_no_cause(fn, line):
    assert likely_cause(raised(fn), line) == ""


def test_the_cause_is_appended_to_the_error_with_the_learners_line():
    text = describe_exception(raised(in_place_on_a_leaf), __file__)
    assert text.splitlines()[0].startswith("RuntimeError: a leaf Variable")
    assert "in in_place_on_a_leaf: w -= 1" in text
    assert text.splitlines()[-1].startswith("likely cause: ")


@pytest.mark.parametrize("peer, phrase", [(lambda r, n: r + 1, "`if rank < world - 1`"),
                                          (lambda r, n: r - 1, "`if rank > 0`")])
def test_a_pipeline_end_left_unguarded_is_named(peer, phrase):
    def fn(dist):
        r, n = dist.get_rank(), dist.get_world_size()
        x = torch.ones(2, dtype=torch.float64)
        if r == (n - 1 if peer(0, 2) == 1 else 0):  # only the end that has no neighbour there
            dist.send(x, peer(r, n))

    exc = raised(lambda: sim.run(fn, 4))
    assert phrase in likely_cause(exc, "dist.send(y, rank + 1)")


def never_meet(first_at: str, second_at: str) -> BaseException:
    from puzzles.simulator.types import CollectiveMismatchError

    return CollectiveMismatchError(
        f"rank 0 waits in all_reduce (call #2 on WORLD) at {first_at}, while rank 3 waits in all_reduce (call #12 on "
        f"group[2, 3]) at {second_at}. The ranks of a group must make the same collective calls, on the same "
        f"group, in the same order; these two can never meet.")


def test_a_rank_already_in_the_graders_code_is_named_as_gone_ahead():
    """One side of two collectives that can never meet is the grader's own (a harness line): that rank returned
    from the learner's function without the collective the other still waits in."""
    cause = likely_cause(never_meet("p19_global_clipping.py:41: self.dist.all_reduce(squares)",
                                    "[harness] harness.py:45: dist.all_reduce(summed, group=group)"), "")
    assert "rank 3 has already left your code" in cause and "rank 3 returned early" in cause
    swapped = likely_cause(never_meet("[harness] harness.py:45: dist.all_reduce(summed, group=group)",
                                      "p19_global_clipping.py:41: self.dist.all_reduce(squares)"), "")
    assert "rank 0 has already left your code" in swapped


@pytest.mark.parametrize("first_at, second_at", [
    ("answer.py:41: dist.all_reduce(a)", "answer.py:50: dist.all_reduce(b, group=g)"),  # both the learner's
    ("[harness] spec.py:4: dist.barrier()", "[harness] spec.py:9: dist.all_reduce(t)"),  # both the grader's
])
def test_a_mismatch_inside_one_side_names_no_rank_gone_ahead(first_at, second_at):
    assert likely_cause(never_meet(first_at, second_at), "") == ""



def met_apart(diff: str) -> BaseException:
    from puzzles.simulator.types import CollectiveMismatchError

    return CollectiveMismatchError(
        f"ranks met in all_gather_into_tensor (call #5 on group[1, 3]) with different arguments: {diff}. Every rank "
        f"of the group must make the same collective call with tensors of the same shape and dtype (torch.distributed "
        f"would hang or silently compute garbage here).")


BRANCHES = ("rank 1 called all_gather_into_tensor at p19_global_clipping.py:79: dist.all_gather_into_tensor(full, "
            "self.master, group=self.dp_group), rank 3 called reduce_scatter_tensor at p19_global_clipping.py:49: "
            "dist.reduce_scatter_tensor(g, flat, group=self.dp_group)")
RETURNED = ("rank 1 passed tensor=float64[8, 32] (at [harness] harness.py:48: dist.all_reduce(summed, "
            "group=group)), rank 0 passed tensor=float64[1] (at p19_global_clipping.py:60: dist.all_reduce(s, "
            "group=self.tp_group))")


def test_p19_ranks_at_different_calls_of_the_step_did_not_decide_alike():
    """p19's step() decides one thing, whether to skip: two ranks at different collectives of it took different
    branches (a norm from a rank's own shard); one already in the grader's code returned early."""
    branches = likely_cause(met_apart(BRANCHES), "", "p19")
    assert "ranks 1 and 3 reached different collectives" in branches
    assert "p19_global_clipping.py:79" in branches and "did not decide the same thing" in branches
    returned = likely_cause(met_apart(RETURNED), "", "p19")
    assert "rank 1 returned early" in returned and "rank 0 is still in a collective of your step()" in returned
    swapped = RETURNED.replace("rank 1 passed", "rank X passed").replace("rank 0 passed", "rank 1 passed")
    assert "rank 0 returned early" in likely_cause(met_apart(swapped.replace("rank X", "rank 0")), "", "p19")


@pytest.mark.parametrize("diff, puzzle", [
    (BRANCHES, ""),  # another puzzle's code can branch for its own reasons: p19's rule is p19's
    (BRANCHES, "p8"),
    ("rank 1 passed tensor=float64[8] (at p19_global_clipping.py:49: dist.reduce_scatter_tensor(g, flat)), rank 3 "
     "passed tensor=float64[9] (at p19_global_clipping.py:49: dist.reduce_scatter_tensor(g, flat))", "p19"),  # shapes
    ("rank 1 passed tensor=float64[8] (at [harness] a.py:4: dist.all_reduce(t)), rank 3 passed tensor=float64[9] "
     "(at [harness] a.py:4: dist.all_reduce(t))", "p19"),  # both in the grader's code
])
def test_p19_ranks_apart_only_when_the_error_says_so(diff, puzzle):
    assert "did not decide the same thing" not in likely_cause(met_apart(diff), "", puzzle)
