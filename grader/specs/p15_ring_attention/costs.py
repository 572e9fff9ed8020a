"""What p15's budgets are made of: one rank's share of the causal attention, in FLOPs (closed forms) and on the
clock (measured with sim.tally: the tile-by-tile work of one rank, its messages left out).

The causal mask empties half of the score matrix. Cut the sequence into 2N chunks of c tokens and count c x c
tiles: query chunk i sees key chunks 0..i, the last of them (i itself, the diagonal) half masked. With chunks i and
2N-1-i on rank i, every rank's queries see (i + 1) + (2N - i) = 2N + 1 tiles: 9 here, of the 64 the whole sequence
has (36 under the diagonal, split 9 per rank).

    a tile's products   forward: scores q·kᵀ and out p·v; backward: the serial model's four (dv = pᵀ·dout,
                        dp = dout·vᵀ, dq = ds·k, dk = dsᵀ·q) and the scores again (recomputed: they are not kept):
                        each 2·b·c²·d FLOPs (2·b·h·c·c·hd)
    the projections     x·wqkv and merged·wo forward (8·b·(S/N)·d²), twice that in backward
"""

from __future__ import annotations

from functools import lru_cache

import torch

from puzzles.model import DTYPE, attention_tile, attention_tile_backward
from puzzles.sim import tally

from ..common.costs import Cost
from .serial import B, CHUNK, COST, D, HD, HEADS, N, TOKENS, zigzag

TILES = 2 * N + 1  # the tiles a rank's queries see, the split balanced
PRODUCT = 2 * B * CHUNK * CHUNK * D  # one product of a tile: 294,912 FLOPs
SCORES = B * HEADS * CHUNK * CHUNK  # a tile's scores: 9,216
ROWS = B * TOKENS * D  # a [b, S/N, d] tensor's elements: 6,144
PROJECTIONS = 24 * B * TOKENS * D * D  # x·wqkv and merged·wo, forward and backward: 4,718,592 FLOPs
# The floor, in products: the projections and the serial model's six products on each of the 2N+1 tiles.
LEAST = PROJECTIONS + TILES * 6 * PRODUCT
# The ceiling: the projections; up to 2N+2 tiles (a rank may compute its own block whole, the diagonal step's
# empty tile included), each with its seven products (the scores recomputed in backward) and 16 FLOPs per score for
# the mask, the softmax and their gradients; and 16 per element of a [b, S/N, d] tensor per step for the merges and
# the accumulated gradients.
MOST = PROJECTIONS + (TILES + 1) * (7 * PRODUCT + 16 * SCORES) + 16 * N * ROWS


def visible(mine, theirs) -> list[tuple[int, int]]:
    return [(i, j) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]


def _merge(out, lse, tile_out, tile_lse):
    """The merge the story states (its ops are what the budget counts), not written as an answer would be."""
    both = torch.logaddexp(lse, tile_lse)
    return torch.exp(lse - both) * out + torch.exp(tile_lse - both) * tile_out, both


def _share(came) -> None:
    """One rank's work, its messages left out: the projections, its 2N+1 tiles forward with their merges, the
    output projection, and back (its tiles' backward, the gradients accumulated, with `came` for the dK/dV that
    arrive, the projections' backward)."""
    x = torch.ones(B, TOKENS, D, dtype=DTYPE, requires_grad=True)
    wqkv = torch.ones(D, 3 * D, dtype=DTYPE, requires_grad=True)
    wo = torch.ones(D, D, dtype=DTYPE, requires_grad=True)
    q, k, v = (t.view(B, TOKENS, HEADS, HD).transpose(1, 2).contiguous() for t in (x @ wqkv).split(D, dim=-1))
    mine = zigzag(0)
    with torch.no_grad():
        queries, outs, lses = q.chunk(2, dim=-2), [None, None], [None, None]
        for step in range(N):
            theirs = zigzag((-step) % N)
            for i, j in visible(mine, theirs):
                o, l = attention_tile(queries[i], k.chunk(2, dim=-2)[j], v.chunk(2, dim=-2)[j], mine[i] == theirs[j])
                outs[i], lses[i] = (o, l) if outs[i] is None else _merge(outs[i], lses[i], o, l)
        out = torch.cat(outs, dim=-2)
        lse = torch.cat(lses, dim=-2)
    out.requires_grad_()
    y = out.transpose(1, 2).reshape(B, TOKENS, D) @ wo
    y.backward(torch.ones_like(y))
    with torch.no_grad():
        grad_q = torch.zeros_like(q)
        pieces = [t.chunk(2, dim=-2) for t in (q, out, lse, out.grad)]
        for step in range(N):
            theirs = zigzag((-step) % N)
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
            for i, j in visible(mine, theirs):
                of_tile = attention_tile_backward(pieces[0][i], k.chunk(2, dim=-2)[j], v.chunk(2, dim=-2)[j],
                                                pieces[1][i], pieces[2][i], pieces[3][i], mine[i] == theirs[j])
                for grad, into, at in zip(of_tile, (grad_q, dk, dv), (i, j, j)):
                    into.chunk(2, dim=-2)[at].add_(grad)
            dk += came[0]  # the travelling dK/dV from the left (the first step adds none; the end, its own block's)
            dv += came[1]
    torch.autograd.backward([q, k, v], [grad_q, dk, dv])


@lru_cache(maxsize=None)
def share() -> Cost:
    """C: one rank's compute on the clock (and its FLOPs)."""
    came = tuple(torch.zeros(B, HEADS, TOKENS, HD, dtype=DTYPE) for _ in range(2))  # received: made by no op
    with tally(COST) as t:
        _share(came)
    return Cost(t.flops, t.ticks, t.ops)


def block_transfer_ticks() -> int:
    """One K/V block's transfer, K and V apart: 2·(alpha + (S/N)·b·d·8/beta)."""
    return 2 * COST.comm_ticks("send", B * TOKENS * D * 8, 2)
