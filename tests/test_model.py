"""puzzles/model.py's transformer block: what the written-out attention and norm compute (against torch's own
kernels), that it is causal, and what it costs on the clock (attention's scores are s² per head)."""


import pytest
import torch
import torch.nn.functional as F

from puzzles import sim
from puzzles.model import (TransformerWeights, causal_attention, init_transformer, make_sequences, rms_norm,
                           transformer_block)

B, S, D, H, HEADS = 2, 8, 16, 32, 4


def torch_block(x, w: TransformerWeights, n_heads):
    """The same block from torch's kernels: scaled_dot_product_attention(is_causal=True) and its own RMS norm."""
    def norm(t, weight):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    b, s, d = x.shape
    q, k, v = (norm(x, w.norm1) @ w.wqkv).split(d, -1)
    q, k, v = (t.view(b, s, n_heads, d // n_heads).transpose(1, 2) for t in (q, k, v))
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
    h = x + att @ w.wo
    return h + F.gelu(norm(h, w.norm2) @ w.w1) @ w.w2


def test_the_block_is_torchs_attention_and_norm_written_out():
    x, _ = make_sequences(B, S, D, 0)
    (w,) = init_transformer(1, D, H, 1, requires_grad=False)
    torch.testing.assert_close(transformer_block(x, w, HEADS), torch_block(x, w, HEADS), rtol=0, atol=1e-12)
    if hasattr(F, "rms_norm"):  # torch >= 2.4
        torch.testing.assert_close(rms_norm(x, w.norm1), F.rms_norm(x, (D,), w.norm1, eps=1e-6), rtol=0, atol=1e-12)


def test_every_weight_gets_a_gradient_and_they_agree_with_torchs_kernels():
    x, target = make_sequences(B, S, D, 2)
    ours, theirs = init_transformer(1, D, H, 3), init_transformer(1, D, H, 3)
    ((transformer_block(x, ours[0], HEADS) - target) ** 2).sum().backward()
    ((torch_block(x, theirs[0], HEADS) - target) ** 2).sum().backward()
    for name, a, b in zip(TransformerWeights._fields, ours[0], theirs[0]):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-10, msg=name)


def test_attention_is_causal():
    x, _ = make_sequences(1, S, D, 4)
    (w,) = init_transformer(1, D, H, 5, requires_grad=False)
    y = causal_attention(x, w.wqkv, w.wo, HEADS)
    changed = x.clone()
    changed[:, 5:] += 1.0  # the future from token 5 on
    z = causal_attention(changed, w.wqkv, w.wo, HEADS)
    torch.testing.assert_close(y[:, :5], z[:, :5], rtol=0, atol=0)
    assert not torch.allclose(y[:, 5:], z[:, 5:])


@pytest.mark.parametrize("s", [8, 16])
def test_attention_costs_its_formula_on_the_clock(s):
    """QKV 2·s·d·3d, scores and the weighted sum 2·2·s²·d, the output projection 2·s·d·d: the products; the mask,
    softmax and scaling are elementwise, on the s² scores of every head."""
    x = torch.randn(1, s, D, dtype=torch.float64)
    (w,) = init_transformer(1, D, H, 6, requires_grad=False)
    with sim.tally() as t:
        causal_attention(x, w.wqkv, w.wo, HEADS)
    assert t.flops_by_class["matmul"] == 2 * s * D * 3 * D + 2 * 2 * s * s * D + 2 * s * D * D
    assert t.flops_by_class["softmax/norm"] == 5 * HEADS * s * s
    assert t.flops > t.flops_by_class["matmul"] + HEADS * s * s  # the scaling and the mask too


def test_attention_of_groups_of_heads_adds_up_to_the_whole():
    """Given a group's q, k, v columns and wo's matching rows, causal_attention returns the group's share of the
    output (tensor parallelism's partial sum): the shares of all groups add up to the whole attention."""
    x, _ = make_sequences(B, S, D, 7)
    (w,) = init_transformer(1, D, H, 8, requires_grad=False)
    groups, width = 2, D // 2
    shares = []
    for g in range(groups):
        cols = torch.cat([torch.arange(j * D + g * width, j * D + (g + 1) * width) for j in range(3)])
        shares.append(causal_attention(x, w.wqkv[:, cols], w.wo[g * width:(g + 1) * width], HEADS // groups))
    torch.testing.assert_close(sum(shares), causal_attention(x, w.wqkv, w.wo, HEADS), rtol=0, atol=1e-12)
