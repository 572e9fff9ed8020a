"""p15: ring attention's figures are the formulas the text states.

- The pieces: attention tile by tile, merged by the online softmax, is causal attention; the tiles' backward adds up
  to autograd's; the serial reference is puzzles.model.causal_attention and each rank's weight gradients add up to
  the serial ones.
- The split: chunks i and 2N-1-i leave every rank 2N+1 tiles (contiguous: 3, 7, 11, 15), and the reference's
  compute is the same on every rank, exactly the projections and 7 products on each of its 9 tiles.
- The bytes: exactly N-1 K/V blocks in forward and N-1 K/V plus N-1 dK/dV blocks in backward.
- The overlap: the reference leaves exactly one block's transfer exposed (the last dK/dV hop home); the all-gather
  naive answer six, waiting at once eight.
- The memory: two received blocks at every message of the forward, the forward keeping 6·Q + lse, the peak the
  figure the text states; the budgets' numbers are the ones the text prints.
- A split that does not give each chunk to one rank is an error that says how.
"""

import math

import pytest
import torch

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_file, observe
from grader.core import report
from grader.core.rules import exposed_communication, flops, product_flops, sent
from grader.frontends.targets import REPO
from grader.specs import SPECS
from grader.specs.p15_ring_attention import serial
from grader.specs.p15_ring_attention.spec import checked_split
from grader.specs.p15_ring_attention.received_blocks import most_held
from grader.specs.p15_ring_attention.checks import tiles_seen
from grader.specs.p15_ring_attention.costs import LEAST, MOST, PRODUCT, PROJECTIONS, TILES, block_transfer_ticks, share
from puzzles import sim
from puzzles.model import DTYPE, attention_tile, attention_tile_backward, causal_attention

SPEC = SPECS["p15"]
N, KV, Q = serial.N, serial.KV, serial.Q


def observed(path, seed=3):
    return observe(SPEC, load_module(path), SPEC.make_inputs(seed), seed)


@pytest.fixture(scope="module")
def reference():
    return observed(REPO / "solutions" / SPEC.filename)


@pytest.fixture(scope="module")
def naive():
    return observed(REPO / "tests" / "naive" / SPEC.filename)


# ---- the pieces


def test_tiles_merged_by_the_online_softmax_are_causal_attention_and_their_backward_autograds():
    """Four chunks of 8 positions: every query chunk against the key chunks it sees, merged with logaddexp, is the
    serial softmax; the tiles' (dq, dk, dv), summed, are autograd's gradients of it."""
    g = torch.Generator().manual_seed(0)
    b, h, s, hd, c = 2, 3, 32, 4, 8
    q, k, v = (torch.randn(b, h, s, hd, generator=g, dtype=DTYPE, requires_grad=True) for _ in range(3))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(hd)).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1),
                                                                   float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    dout = torch.randn(b, h, s, hd, generator=g, dtype=DTYPE)
    expected.backward(dout)
    chunk = lambda t, i: t.detach()[..., i * c:(i + 1) * c, :]  # noqa: E731
    outs, lses = [], []
    for i in range(s // c):
        out, lse = attention_tile(chunk(q, i), chunk(k, 0), chunk(v, 0), i == 0)
        for j in range(1, i + 1):
            o, l = attention_tile(chunk(q, i), chunk(k, j), chunk(v, j), i == j)
            total = torch.logaddexp(lse, l)
            out, lse = torch.exp(lse - total) * out + torch.exp(l - total) * o, total
        outs.append(out)
        lses.append(lse)
    out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)
    torch.testing.assert_close(out, expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(scores.detach(), dim=-1, keepdim=True), rtol=0, atol=1e-12)
    dq, dk, dv = (torch.zeros(b, h, s, hd, dtype=DTYPE) for _ in range(3))
    for i in range(s // c):
        for j in range(i + 1):
            a, bb, cc = attention_tile_backward(chunk(q, i), chunk(k, j), chunk(v, j), chunk(out, i), chunk(lse, i),
                                                dout[..., i * c:(i + 1) * c, :], i == j)
            dq[..., i * c:(i + 1) * c, :] += a
            dk[..., j * c:(j + 1) * c, :] += bb
            dv[..., j * c:(j + 1) * c, :] += cc
    for got, leaf in ((dq, q), (dk, k), (dv, v)):
        torch.testing.assert_close(got, leaf.grad, rtol=0, atol=1e-12)


def test_the_serial_reference_is_the_models_attention_and_each_ranks_share_adds_up():
    inputs = SPEC.make_inputs(5)
    ref = serial.serial(inputs)
    x = inputs["x"].clone().requires_grad_()
    wqkv, wo = inputs["wqkv"].clone().requires_grad_(), inputs["wo"].clone().requires_grad_()
    y = causal_attention(x, wqkv, wo, serial.HEADS)
    torch.testing.assert_close(ref["y"], y.detach(), rtol=0, atol=1e-12)
    ((y - inputs["target"]) ** 2).sum().div(serial.B * serial.TOKENS).backward()
    torch.testing.assert_close(ref["x_grad"], x.grad, rtol=0, atol=1e-12)
    shares = [serial.expected_on(ref, inputs, serial.zigzag(r)) for r in range(N)]
    torch.testing.assert_close(sum(s["wqkv_grad"] for s in shares), wqkv.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(sum(s["wo_grad"] for s in shares), wo.grad, rtol=0, atol=1e-12)


# ---- the split and the compute


def test_the_balanced_split_leaves_every_rank_2n_plus_1_tiles_and_a_contiguous_one_does_not():
    assert [tiles_seen(serial.zigzag(r)) for r in range(N)] == [TILES] * N == [9] * N
    assert [tiles_seen((2 * r, 2 * r + 1)) for r in range(N)] == [3, 7, 11, 15]
    assert sum(tiles_seen(serial.zigzag(r)) for r in range(N)) == serial.CHUNKS * (serial.CHUNKS + 1) // 2


def test_the_compute_formulas_are_the_products_the_serial_model_and_the_reference_compute():
    """The floor: the serial model's six products on each of a rank's 9 tiles (measured: one tile's attention
    through autograd, forward and backward) and the projections; the reference: the same and the scores once more
    in backward, exactly, on every rank."""
    q, k, v = (torch.ones(serial.B, serial.HEADS, serial.CHUNK, serial.HD, dtype=DTYPE, requires_grad=True)
               for _ in range(3))
    with sim.tally(serial.COST) as t:
        (torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(serial.HD), dim=-1) @ v).sum().backward()
    assert t.flops_by_class["matmul"] == 6 * PRODUCT
    assert PROJECTIONS == 24 * serial.B * serial.TOKENS * serial.D ** 2 == 4_718_592
    assert LEAST == PROJECTIONS + TILES * 6 * PRODUCT == 20_643_840
    assert MOST == 27_230_208
    assert share().flops < MOST and share().ticks == 34_365


def test_the_reference_computes_the_same_on_every_rank_its_tiles_and_no_more(reference):
    products = [product_flops(reference, r) for r in range(N)]
    assert products == [PROJECTIONS + TILES * 7 * PRODUCT] * N
    totals = [flops(reference, r) for r in range(N)]
    assert len(set(totals)) == 1 and LEAST < totals[0] < MOST
    assert abs(reference.busy_ticks(0) - share().ticks) <= share().ticks // 50  # C is what a rank computes


def test_a_contiguous_split_puts_five_times_the_work_on_the_last_rank():
    obs = observed(REPO / "tests" / "wrong" / "p15_contiguous_split.py")
    products = [product_flops(obs, r) - PROJECTIONS for r in range(N)]
    assert [p // (7 * PRODUCT) for p in products] == [3, 7, 11, 15]
    result = grade_file(SPEC, REPO / "tests" / "wrong" / "p15_contiguous_split.py", seed=3)
    balance = next(c for c in result.checks if c.name == "balance")
    assert balance.measured > 2 and "3, 7, 11, 15 tiles" in balance.diagnosis


# ---- the bytes and the clock


def test_the_reference_sends_exactly_n_minus_1_blocks_each_way(reference):
    for r in range(N):
        assert sum(b for _, b in sent(reference, r, "forward").values()) == (N - 1) * KV == 294_912
        assert sum(b for _, b in sent(reference, r, "backward").values()) == 2 * (N - 1) * KV == 589_824


def test_the_reference_leaves_one_block_transfer_exposed_the_naive_answer_six(reference, naive):
    t = block_transfer_ticks()
    assert t == 2 * (serial.COST.latency_ticks + Q // serial.COST.bytes_per_tick) == 784
    assert exposed_communication(reference, share().ticks)[2] == t
    assert exposed_communication(naive, share().ticks)[2] == 2 * (N - 1) * t == 4_704
    waiting = observed(REPO / "tests" / "wrong" / "p15_wait_before_compute.py")
    assert exposed_communication(waiting, share().ticks)[2] == 8 * t == 6_272
    # The check counts the compute stream as work only where arithmetic explains it (issue 29): the buffers the
    # reference zeroes and fills while its messages are in flight count as exposed too, and it stays in the budget.
    budget = SPEC.budgets(SPEC.make_inputs(0))["makespan"].value
    assert t < exposed_communication(reference, share().ticks, serial.COST.device)[2] <= budget - t // 2


# ---- memory


def test_the_reference_holds_two_blocks_and_keeps_its_activations_only(reference, naive):
    for r in range(N):
        held = reference.results[r]["held"]
        assert most_held(held, "forward")[0] == 2 * KV
        assert most_held(held, "backward")[0] == 3 * KV  # the block, the next, and a travelling dK/dV
        assert reference.results[r]["kept"] == 6 * Q + serial.LSE == 297_984
        assert most_held(naive.results[r]["held"], "forward")[0] == N * KV
    assert max(reference.peak_bytes) == 1_470_992


def test_the_budgets_are_the_numbers_the_text_prints():
    budgets = {k: b.value for k, b in SPEC.budgets(SPEC.make_inputs(0)).items()}
    assert budgets == {"K/V blocks": 197_632, "K/V blocks in backward": 394_240, "peak memory": 2_425_856,
                       "forward memory": 394_240, "compute": 27_230_208, "balance": 0.05,
                       "forward communication": 295_936, "backward communication": 590_848, "makespan": 1_471}


# ---- the split's contract


@pytest.mark.parametrize("chunks, says", [
    (lambda r, n: (r, r), "no rank holds chunk(s) [4, 5, 6, 7]"),
    (lambda r, n: (0, 2 * n - 1), "on more than one rank"),
    (lambda r, n: [r], "must return two chunk numbers"),
    (lambda r, n: (float(r), 7.0 - r), "must return two chunk numbers"),
])
def test_a_split_that_is_not_a_partition_is_refused_with_what_is_wrong(chunks, says):
    with pytest.raises((TypeError, ValueError), match=".*") as err:
        checked_split(chunks, N)
    assert says in str(err.value)


def test_an_answer_whose_split_is_not_a_partition_is_an_error_naming_the_chunks(tmp_path):
    source = (REPO / "solutions" / SPEC.filename).read_text().replace(
        "return rank, 2 * world_size - 1 - rank", "return rank, rank + 1")
    path = tmp_path / SPEC.filename
    path.write_text(source)
    result = grade_file(SPEC, path, seed=0)
    assert result.status == "error", report.pytest_message(result, 0)
    assert "load_balanced_chunks must give each of the 2N = 8 chunks" in result.error
