"""p14's figures: the serial blocks' work (measured on the clock, with its closed form), one rank's share, and the
activation memory and bytes of sequence parallelism against plain tensor parallelism's.

With T = b·s tokens, Z = b·a·s² attention scores, E = b·s·d·8 bytes (one [b, s, d] activation):

    a block's matrix products, forward      8·T·d² + 4·T·d·h + 4·b·s²·d      (qkv 6·T·d², wo 2·T·d², w1 and w2
                                                                              2·T·d·h each; scores and p@v 2·b·s²·d
                                                                              each); backward twice as many
    its other ops, forward and backward     34·T·d + 10·T + 13·Z + 2·T·h     (two RMS norms, the residual adds, the
                                                                              scaling, mask and softmax of the scores,
                                                                              gelu, and their backwards)
    the loss's backward                     3·T·d + T

Every one of these is split N ways by tensor + sequence parallelism (heads and columns by tensor parallelism, the
norms and residual adds by the sequence), so a rank's share is exactly the serial step's work / N (tests/
test_p14_sequence_parallel.py holds the closed forms to the measurements). Plain tensor parallelism, the figure the
text compares with, is measured here too (measured_tensor_parallel), for the test and bench/."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from puzzles import sim
from puzzles.model import TransformerWeights, causal_attention, init_transformer, make_sequences, rms_norm, \
    transformer_block
from puzzles.sim import CostModel

from ...core.probe import memory_now
from ...core.rules import BOOKKEEPING_BYTES
from ..common.costs import Cost, measure
from .layout import B, D, E, F64, H, HEADS, L, N, S, SN, sequence_loss, shard_layers

COST = CostModel()
T, Z = B * S, B * HEADS * S * S

BLOCK_PRODUCTS = 3 * (8 * T * D * D + 4 * T * D * H + 4 * B * S * S * D)  # forward and backward
BLOCK_OTHER = 34 * T * D + 10 * T + 13 * Z + 2 * T * H
LOSS_BACKWARD = 3 * T * D + T
SERIAL_FLOPS = L * (BLOCK_PRODUCTS + BLOCK_OTHER) + LOSS_BACKWARD
PRODUCT_FLOPS = L * BLOCK_PRODUCTS // N  # a rank's matrix products: the floor
# bookkeeping: four elementwise passes over [b, s, d] a block. Room for the additions of the collectives written
# with send and recv (puzzle 13's rings), which the collectives do for free on the communication stream: the 4·L
# reduce-scatters' N-1 chunks of [b, s/N, d] each (3·L·b·s·d FLOPs), the norms' gradients' all-reduces (a few
# hundred), and a little more
ALLOWANCE = 4 * L * B * S * D
RANK_WORK = SERIAL_FLOPS // N + 1  # + the backward of the grader's division of the rank's loss by N (a scalar)
SHARE = RANK_WORK + ALLOWANCE
# What the common excesses cost: plain tensor parallelism's norms and residual adds on every token (each rank
# repeats the (N-1)/N of them that are other ranks' tokens), and one block's forward of a rank's share run again
REPEATED_TOKEN_WORK = (N - 1) * L * (34 * T * D + 10 * T) // N
REPEATED_NORM_WORK = (N - 1) * L * (30 * T * D + 10 * T) // N  # the norms' part (the residual adds: 4·T·d a block)
BLOCK_FORWARD = 8 * T * D * D + 4 * T * D * H + 4 * B * S * S * D + 10 * T * D + 4 * T + 7 * Z + T * H
BLOCK_BACKWARD = 2 * (8 * T * D * D + 4 * T * D * H + 4 * B * S * S * D) + 24 * T * D + 6 * T + 6 * Z + T * H
RANK_BLOCK_FORWARD = BLOCK_FORWARD // N
RANK_BACKWARD = (L * BLOCK_BACKWARD + LOSS_BACKWARD) // N + 1  # what a rank computes inside backward


def measured_serial_step() -> Cost:
    """The serial blocks' forward and backward and the loss's backward on the clock (the loss's forward is the
    grader's, free inside a rank)."""
    x, target = make_sequences(B, S, D, 0)
    layers = init_transformer(L, D, H, 1)
    x.requires_grad_()
    out = {}

    def forward():
        y = x
        for w in layers:
            y = transformer_block(y, w, HEADS)
        out["y"] = y

    blocks = measure(COST, forward)
    out["loss"] = sequence_loss(out["y"], target)
    backward = measure(COST, lambda: out["loss"].backward())
    return blocks + backward


# ---- activation memory: what one block's forward leaves alive for its backward, its output included, per rank

SCORES = B * (HEADS // N) * S * S * F64  # one rank's softmax output p, [b, a/N, s, s]
HIDDEN = 2 * B * S * (H // N) * F64  # x@w1_r and its gelu, [b, s, h/N] each
MASK = S * S  # the causal mask, [s, s] of bool
SP_BLOCK = 2 * E + 8 * E // N + HIDDEN + SCORES + 2 * B * SN * F64 + MASK
TP_BLOCK = 6 * E + 4 * E // N + HIDDEN + SCORES + 2 * B * S * F64 + MASK
ACTIVATIONS = L * SP_BLOCK + E // N + BOOKKEEPING_BYTES  # + one [b, s/N, d]: the input shard in another layout
TP_ACTIVATIONS = L * TP_BLOCK

# ---- bytes each rank sends: tensor parallelism's two all-reduces of [b, s, d] per block each way; the norms'
# gradients all-reduced once more in backward

ALL_REDUCE_E = 2 * (N - 1) * E // N
TP_BYTES = L * 2 * ALL_REDUCE_E  # each way
NORM_GRAD_BYTES = L * 2 * (2 * (N - 1) * D * F64 // N)
FORWARD_BYTES = TP_BYTES + BOOKKEEPING_BYTES
BACKWARD_BYTES = TP_BYTES + NORM_GRAD_BYTES + BOOKKEEPING_BYTES


# ---- plain tensor parallelism, measured: the figures the text compares sequence parallelism with


def _tensor_parallel(dist, x, target, layers):
    """Puzzle 4's f and g on the transformer block, the whole sequence on every rank (every rank given the whole x):
    what its forward leaves alive for backward."""

    class CopyToTensorParallel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t

        @staticmethod
        def backward(ctx, grad):
            summed = grad.clone()
            dist.all_reduce(summed)
            return summed

    class ReduceFromTensorParallel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            total = t.clone()
            dist.all_reduce(total)
            return total

        @staticmethod
        def backward(ctx, grad):
            return grad

    f, g = CopyToTensorParallel.apply, ReduceFromTensorParallel.apply
    before = memory_now()
    h = x
    for w in layers:
        h = h + g(causal_attention(f(rms_norm(h, w.norm1)), w.wqkv, w.wo, HEADS // N))
        h = h + g(F.gelu(f(rms_norm(h, w.norm2)) @ w.w1) @ w.w2)
    held = memory_now() - before
    sequence_loss(h, target).backward()
    return held


def measured_tensor_parallel(seed: int = 0):
    """Plain tensor parallelism on the puzzle's blocks, on the simulator with the puzzle's clock: the sim.run
    result, whose rank results are the bytes each rank's forward left alive."""
    x, target = make_sequences(B, S, D, seed)
    layers = init_transformer(L, D, H, seed + 1)
    rank_args = [(x.clone().requires_grad_(), target,
                  [TransformerWeights(*(t.requires_grad_() for t in w)) for w in shard_layers(layers, r)])
                 for r in range(N)]
    return sim.run(_tensor_parallel, N, rank_args=rank_args, cost=COST)
