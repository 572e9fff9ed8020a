"""p14's sizes, the serial transformer blocks it is graded against, and how the weights are cut between the ranks.

The sequence-parallel ranks hold: tokens r·s/N to (r+1)·s/N - 1 of every sequence (the block's input and output,
the residual stream), the columns of heads r·a/N to (r+1)·a/N - 1 in wqkv (their q, k and v columns) and the
matching rows of wo, the r-th column block of w1 and row block of w2, and the two norms' weights whole (every rank
uses them, on its own tokens)."""

from __future__ import annotations

import torch

from puzzles.model import TransformerWeights, loss_fn, transformer_block

N, B, S, D, HEADS, H, L = 4, 2, 32, 64, 8, 256, 2  # ranks, sequences, tokens, width, heads, MLP width, blocks
SN = S // N  # tokens per rank
DN, HN = D // N, H // N  # attention columns (HEADS/N heads), MLP columns per rank
F64 = 8
E = B * S * D * F64  # one [b, s, d] activation of the whole sequence
NORMS = ("norm1", "norm2")
MATRICES = ("wqkv", "wo", "w1", "w2")


def sequence_loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """loss_fn over every token: the squared error summed over features, averaged over the b·s tokens."""
    return loss_fn(y.reshape(-1, y.shape[-1]), target.reshape(-1, target.shape[-1]))


def tokens(rank: int) -> slice:
    return slice(rank * SN, (rank + 1) * SN)


def qkv_columns(rank: int) -> torch.Tensor:
    """The columns of wqkv that rank r's heads use: its q columns, then its k columns, then its v columns."""
    return torch.cat([torch.arange(j * D + rank * DN, j * D + (rank + 1) * DN) for j in range(3)])


def shard(weights: TransformerWeights, rank: int) -> TransformerWeights:
    """Rank r's pieces of one block's weights (copies, detached)."""
    hidden, heads = slice(rank * HN, (rank + 1) * HN), slice(rank * DN, (rank + 1) * DN)
    w = TransformerWeights(*(t.detach() for t in weights))
    return TransformerWeights(norm1=w.norm1.clone(), wqkv=w.wqkv[:, qkv_columns(rank)].clone(),
                              wo=w.wo[heads, :].clone(), norm2=w.norm2.clone(), w1=w.w1[:, hidden].clone(),
                              w2=w.w2[hidden, :].clone())


def shard_layers(layers, rank: int) -> list[TransformerWeights]:
    return [shard(w, rank) for w in layers]


def grads_of(weights: TransformerWeights) -> dict:
    """A block's weight gradients as {name: grad}: plain data, which a real process can send back (a NamedTuple
    arrives as a plain tuple)."""
    return {name: getattr(weights, name).grad for name in TransformerWeights._fields}


def serial(x: torch.Tensor, target: torch.Tensor, layers) -> dict:
    """The blocks on the whole sequence: the output, the input gradient and every weight's gradient."""
    x = x.detach().clone().requires_grad_()
    ws = [TransformerWeights(*(t.detach().clone().requires_grad_() for t in w)) for w in layers]
    y = x
    for w in ws:
        y = transformer_block(y, w, HEADS)
    sequence_loss(y, target).backward()
    return {"y": y.detach(), "x_grad": x.grad, "grads": [grads_of(w) for w in ws]}


def rank_slice(ref: dict, rank: int) -> dict:
    """What rank r should hold: its tokens of y and x.grad, its pieces of the matrices' gradients, the norms'
    gradients whole."""
    return {"y": ref["y"][:, tokens(rank)], "x_grad": ref["x_grad"][:, tokens(rank)],
            "grads": [shard(TransformerWeights(**g), rank)._asdict() for g in ref["grads"]]}
