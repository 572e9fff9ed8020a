"""The tiny model every puzzle shares.

A stack of L residual MLP blocks, written as plain functions on plain tensors (no nn.Module), so that every
tensor a puzzle moves between ranks is one you can see:

    block(x) = x + gelu(x @ w1) @ w2        x: [batch, d]    w1: [d, h]    w2: [h, d]

    x ──┬── @w1 ── gelu ── @w2 ──(+)── y
        └───────────────────────────┘

`layers` is a list of (w1, w2) pairs, one per block. The loss is the squared error summed over features and
*averaged over the batch*: that average is why data-parallel ranks must average their gradients, not add them.
Everything is float64, so a correct answer matches the serial reference to about 1e-12.
"""

from __future__ import annotations

import math

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
