"""The tiny models the puzzles share, written as plain functions on plain tensors (no nn.Module), so that every
tensor a puzzle moves between ranks is one you can see.

Parts I and II: a stack of L residual MLP blocks,

    block(x) = x + gelu(x @ w1) @ w2        x: [batch, d]    w1: [d, h]    w2: [h, d]

    x ──┬── @w1 ── gelu ── @w2 ──(+)── y
        └───────────────────────────┘

`layers` is a list of (w1, w2) pairs, one per block. The loss is the squared error summed over features and
*averaged over the batch*: that average is why data-parallel ranks must average their gradients, not add them.

Part III: a pre-norm transformer block over sequences, the same MLP after a causal multi-head self-attention,
each behind an RMS norm and a residual connection (transformer_block, below); and attention computed one tile (a
chunk of queries against a chunk of keys) at a time, forward and backward, as ring attention computes it.

Everything is float64, so a correct answer matches the serial reference to about 1e-12.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

DTYPE = torch.float64


def block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One residual MLP block: x + gelu(x @ w1) @ w2."""
    return x + F.gelu(x @ w1) @ w2


def forward(x: torch.Tensor, layers) -> torch.Tensor:
    """Run x through every block of `layers` in order."""
    for w1, w2 in layers:
        x = block(x, w1, w2)
    return x


def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Squared error, summed over features, averaged over the rows of the batch."""
    return ((y - target) ** 2).sum(dim=1).mean()


def init_layers(n_layers: int, d: int, h: int, seed: int, requires_grad: bool = True):
    """Deterministic weights: [(w1, w2)] * n_layers, scaled so activations stay of order one."""
    g = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(n_layers):
        w1 = torch.randn(d, h, generator=g, dtype=DTYPE) / math.sqrt(d)
        w2 = torch.randn(h, d, generator=g, dtype=DTYPE) / math.sqrt(h) / 2
        layers.append((w1.requires_grad_(requires_grad), w2.requires_grad_(requires_grad)))
    return layers


def make_batch(batch: int, d: int, seed: int):
    """A random batch (x, target), both [batch, d]."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, d, generator=g, dtype=DTYPE), torch.randn(batch, d, generator=g, dtype=DTYPE)


# ---- Part III: the transformer block


class TransformerWeights(NamedTuple):
    """One transformer block's weights (d = model width, h = MLP width):

    norm1, norm2  [d]        the two RMS norms' scales
    wqkv          [d, 3d]    queries, keys and values, side by side (head i: columns i·hd to (i+1)·hd of each)
    wo            [d, d]     the attention's output projection
    w1, w2        [d, h], [h, d]   the MLP, as in block()
    """

    norm1: torch.Tensor
    wqkv: torch.Tensor
    wo: torch.Tensor
    norm2: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) · weight, over the last dimension: each token's vector scaled to unit RMS."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def causal_attention(x: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Multi-head self-attention in which token t sees tokens 0..t only, written out. x: [batch, s, d].

    It works on any group of heads too (tensor parallelism splits them between ranks): given only their columns
    of wqkv ([d, 3·width]: their q columns, then their k columns, then their v columns) and the matching rows of
    wo ([width, d]), with n_heads the number of heads in the group, it returns their share of the output, [b, s, d]
    (summed over every group of heads, the whole attention)."""
    b, s, _ = x.shape
    width = wqkv.shape[1] // 3  # the heads' q (or k, or v) columns: d for all of them
    hd = width // n_heads  # each head's width
    q, k, v = (x @ wqkv).split(width, dim=-1)  # [b, s, width] each

    def heads(t):  # [b, s, width] -> [b, heads, s, hd]
        return t.view(b, s, n_heads, hd).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)  # [b, heads, s, s]: query i against key j
    future = torch.ones(s, s, dtype=torch.bool).triu(1)  # key j > query i: not seen yet
    scores = scores.masked_fill(future, float("-inf"))
    p = torch.softmax(scores, dim=-1)  # each row sums to 1 over the keys it may see
    out = p @ v  # [b, heads, s, hd]
    out = out.transpose(1, 2).reshape(b, s, width)  # the heads side by side again
    return out @ wo


def transformer_block(x: torch.Tensor, weights: TransformerWeights, n_heads: int) -> torch.Tensor:
    """A pre-norm transformer block: x + attention(norm(x)), then + mlp(norm(.)). x: [batch, s, d].

        x ──┬── rms_norm ── causal_attention ──(+)──┬── rms_norm ── @w1 ── gelu ── @w2 ──(+)── y
            └───────────────────────────────────┘  └─────────────────────────────────────┘
    """
    h = x + causal_attention(rms_norm(x, weights.norm1), weights.wqkv, weights.wo, n_heads)
    return h + F.gelu(rms_norm(h, weights.norm2) @ weights.w1) @ weights.w2


def init_transformer(n_layers: int, d: int, h: int, seed: int, requires_grad: bool = True):
    """Deterministic weights for `n_layers` transformer blocks: a list of TransformerWeights."""
    g = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(n_layers):
        weights = TransformerWeights(
            norm1=1 + 0.1 * torch.randn(d, generator=g, dtype=DTYPE),
            wqkv=torch.randn(d, 3 * d, generator=g, dtype=DTYPE) / math.sqrt(d),
            wo=torch.randn(d, d, generator=g, dtype=DTYPE) / math.sqrt(d) / 2,
            norm2=1 + 0.1 * torch.randn(d, generator=g, dtype=DTYPE),
            w1=torch.randn(d, h, generator=g, dtype=DTYPE) / math.sqrt(d),
            w2=torch.randn(h, d, generator=g, dtype=DTYPE) / math.sqrt(h) / 2)
        layers.append(TransformerWeights(*(w.requires_grad_(requires_grad) for w in weights)))
    return layers


def make_sequences(batch: int, s: int, d: int, seed: int):
    """A random batch of sequences (x, target), both [batch, s, d]."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, s, d, generator=g, dtype=DTYPE), torch.randn(batch, s, d, generator=g, dtype=DTYPE))


# ---- Part III: attention one tile at a time (ring attention; flash attention works the same way inside a GPU)


def attention_tile(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, diagonal: bool):
    """Attention of one chunk of queries against one chunk of keys and values alone: (out, lse).

    q: [b, heads, c, hd]; k, v: [b, heads, c', hd]. out [b, heads, c, hd] is the softmax-weighted sum of these
    values; lse [b, heads, c, 1] the log of the sum of exp(score) over these keys: what lets results over different
    keys be merged later (the online softmax). `diagonal`: the two chunks are the same positions, so query t sees
    keys 0..t of the chunk only (the causal mask); otherwise it sees every key of the chunk."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [b, heads, c, c']
    if diagonal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


def attention_tile_backward(q, k, v, out, lse, grad_out, diagonal: bool):
    """One tile's part of the gradients, (dq, dk, dv), given the query chunk's final out and lse (over every key it
    sees, all tiles merged) and out's gradient. The scores are computed again, not kept: flash attention's backward.
    Summed over the tiles a query chunk sees, the dq are its gradient; summed over the query chunks that see a key
    chunk, the dk and dv are that chunk's."""
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if diagonal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(scores - lse)  # this tile's share of each query's softmax over all the keys it sees
    dv = p.transpose(-2, -1) @ grad_out
    ds = p * (grad_out @ v.transpose(-2, -1) - (grad_out * out).sum(dim=-1, keepdim=True)) * scale
    return ds @ k, ds.transpose(-2, -1) @ q, dv
