"""p14 beyond the generic tests: its figures against their formulas (the serial blocks' work, a rank's share, the
activation memory of sequence parallelism, of plain tensor parallelism and of Megatron's re-gathering, the bytes
against tensor parallelism's all-reduces), and the replayed mistakes (the right links give the serial blocks, and
each mistake is named as itself)."""

from pathlib import Path

import pytest
import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import observe
from grader.core.grading import one_thread
from grader.core.rules import flops, product_flops, sent
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p14_sequence_parallel import costs
from grader.specs.p14_sequence_parallel import mistakes
from grader.specs.p14_sequence_parallel.layout import E, L, N, rank_slice

SPEC = SPECS["p14"]
TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _one_thread():
    """As the grader checks: the sizes are small, and OpenMP threads on a busy machine make the replays 20x slower."""
    with one_thread():
        yield


def observed(path: Path, seed: int = 4):
    inputs = SPEC.make_inputs(seed)
    return observe(SPEC, load_module(path), inputs, seed), inputs


def volume(obs, rank, phase):
    return sum(b for _, b in sent(obs, rank, phase).values())


def test_the_serial_work_is_its_closed_form():
    """W = L·(3·(8·T·d² + 4·T·d·h + 4·b·s²·d) + 34·T·d + 10·T + 13·Z + 2·T·h) + 3·T·d + T, as the text says."""
    assert costs.measured_serial_step().flops == costs.SERIAL_FLOPS == 41_678_144


def test_the_reference_computes_sends_and_holds_the_formulas():
    obs, _ = observed(REPO / "solutions" / SPEC.filename)
    for r in range(N):
        assert flops(obs, r) == costs.RANK_WORK == costs.SERIAL_FLOPS // N + 1
        assert flops(obs, r, "backward") == costs.RANK_BACKWARD
        assert product_flops(obs, r) == costs.PRODUCT_FLOPS
        assert obs.results[r]["held"] == L * costs.SP_BLOCK == 461_312
        assert volume(obs, r, "forward") == costs.TP_BYTES == 196_608
        assert volume(obs, r, "backward") == costs.TP_BYTES + costs.NORM_GRAD_BYTES == 199_680


def test_plain_tensor_parallelism_holds_the_figure_the_text_gives_and_sends_the_same_bytes():
    result = costs.measured_tensor_parallel(seed=4)
    assert result.results == [costs.TP_ACTIVATIONS] * N == [L * costs.TP_BLOCK] * N == [659_456] * N
    events = [e.to_dict() for e in result.events]
    for r in range(N):
        for phase in ("forward", "backward"):
            assert sum(e["wire_bytes"] for e in events if e["rank"] == r and e["stream"] == "comm"
                       and e["phase"] == phase and e["kind"] == "all_reduce") == costs.TP_BYTES
    assert L * costs.SP_BLOCK / costs.TP_ACTIVATIONS == pytest.approx(0.6995, abs=1e-4)  # "70%" in the text


def test_the_naive_answer_repeats_the_token_work_and_holds_what_tensor_parallelism_does():
    obs, _ = observed(TESTS / "naive" / SPEC.filename)
    for r in range(N):
        assert flops(obs, r) == costs.RANK_WORK + costs.REPEATED_TOKEN_WORK
        assert product_flops(obs, r) == costs.PRODUCT_FLOPS  # the excess is the norms' and residual adds' alone
        assert obs.results[r]["held"] == costs.TP_ACTIVATIONS + E // N  # and its own tokens of y, copied out


def test_megatrons_re_gather_holds_the_figure_the_text_gives_for_one_all_gather_more():
    obs, _ = observed(TESTS / "wrong" / "p14_gathered_again_in_backward.py")
    for r in range(N):
        assert obs.results[r]["held"] == L * (costs.SP_BLOCK - 2 * E + 2 * E // N) == 363_008
        assert volume(obs, r, "backward") == costs.TP_BYTES + costs.NORM_GRAD_BYTES + L * 2 * (N - 1) * E // N


def test_the_norms_on_the_whole_sequence_cost_the_named_excess():
    obs, _ = observed(TESTS / "wrong" / "p14_norm_on_whole_sequence.py")
    assert flops(obs, 0) == costs.RANK_WORK + costs.REPEATED_NORM_WORK


def test_the_budgets_separate_the_reference_from_tensor_parallelism():
    budgets = SPEC.budgets(SPEC.make_inputs(0))
    assert L * costs.SP_BLOCK + E // N <= budgets["activation memory"].value < costs.TP_ACTIVATIONS
    assert budgets["compute"].value + 4 * costs.ALLOWANCE < costs.RANK_WORK + costs.REPEATED_NORM_WORK


# ---- the replay


def test_the_replay_of_the_right_links_is_the_serial_blocks():
    inputs = SPEC.make_inputs(2)
    ref = SPEC.reference(inputs)
    got = mistakes.replay(inputs)
    for r in range(N):
        assert mistakes.matches(got[r], rank_slice(ref["full"], r), ["y", "x_grad", "grads"])


@pytest.mark.parametrize("name", list(mistakes.FORWARD_MISTAKES) + list(mistakes.BACKWARD_MISTAKES))
def test_each_replayed_mistake_is_wrong_and_named_as_itself(name):
    inputs = SPEC.make_inputs(3)
    ref = SPEC.reference(inputs)
    replays = mistakes.Replays(inputs)
    got = replays.get(name)
    forward = name in mistakes.FORWARD_MISTAKES
    text = (mistakes.FORWARD_MISTAKES if forward else mistakes.BACKWARD_MISTAKES)[name][1]
    right_y = all(mistakes.matches(g, w, ["y"]) for g, w in zip(got, ref["ranks"]))
    assert right_y != forward  # a forward mistake changes y; a backward one leaves it right
    assert not all(mistakes.matches(g, w, ["y", "x_grad", "grads"]) for g, w in zip(got, ref["ranks"]))
    if forward:
        assert SPEC.diagnose_output(got, replays) == text
    else:
        assert SPEC.diagnose_grads(got, ref["ranks"], replays, "grads") == text


def test_a_gradient_of_the_wrong_shape_gets_no_diagnosis_and_no_crash():
    inputs = SPEC.make_inputs(1)
    ref = SPEC.reference(inputs)
    got = [{**g, "grads": [{**w, "norm1": torch.zeros(3)} for w in g["grads"]]} for g in ref["ranks"]]
    assert SPEC.diagnose_grads(got, ref["ranks"], mistakes.Replays(inputs), "norms") == ""


def test_the_readme_row_states_every_budget_and_tensor_parallelisms_figure():
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| p14 |"))
    for budget in SPEC.budgets(SPEC.make_inputs(0)).values():
        assert f"{budget.value:,}" in row, budget.name
    assert f"{costs.TP_ACTIVATIONS:,}" in row and f"{costs.PRODUCT_FLOPS:,}" in row
