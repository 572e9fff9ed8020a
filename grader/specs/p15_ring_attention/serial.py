"""p15's sizes, its inputs (made chunk by chunk, so that a rank can make its own two chunks), the serial causal
attention with what the checks compare on each rank, and the common mistakes replayed to name a wrong answer.

The sequence of S tokens is cut into 2N chunks of c = S/2N tokens; a rank holds two of them (the answer's
load_balanced_chunks says which), so what a rank's output and gradients must be depends on its chunks: the serial
reference is computed once over the whole sequence, and each rank's part is read off at its tokens' positions.
The loss the grader backpropagates is each rank's loss_fn over its own tokens, so the serial loss is their sum.
"""

from __future__ import annotations

import math

import torch

from puzzles.model import DTYPE, init_transformer
from puzzles.sim import CostModel

N, B, S, D, HEADS = 4, 2, 384, 32, 2  # ranks, batch, sequence, model width, heads
HD = D // HEADS  # 16: each head's width
CHUNKS = 2 * N  # the sequence's chunks: a rank holds two
CHUNK = S // CHUNKS  # c = 48 tokens
TOKENS = S // N  # 96 tokens per rank
F64 = 8
Q = B * TOKENS * D * F64  # 49,152 bytes: one rank's [b, S/N, d] (x, q, k, v, out, their gradients)
KV = 2 * Q  # a K/V block: one rank's keys and values, 98,304 bytes
TILE = B * HEADS * CHUNK * CHUNK * F64  # 73,728 bytes: the scores of one query chunk against one key chunk
LSE = B * HEADS * TOKENS * F64  # 3,072 bytes: one rank's log-sum-exps
W = (3 * D * D + D * D) * F64  # 32,768 bytes: wqkv and wo
COST = CostModel(latency_ticks=8, bytes_per_tick=128)


def zigzag(rank: int, world: int = N) -> tuple[int, int]:
    """The load-balanced split: chunk i and chunk 2N-1-i."""
    return rank, 2 * world - 1 - rank


def positions(chunks) -> torch.Tensor:
    """The sequence positions of a rank's tokens, its chunks' in the order given."""
    return torch.cat([torch.arange(c * CHUNK, (c + 1) * CHUNK) for c in chunks])


def owners(split) -> torch.Tensor:
    """[S]: the rank that holds each position, for a split (one pair of chunks per rank)."""
    owner = torch.empty(S, dtype=torch.long)
    for rank, chunks in enumerate(split):
        owner[positions(chunks)] = rank
    return owner


def chunk_inputs(seed: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunk `chunk` of the sequence's x and target, [b, c, d] each: a rank makes its own two (the grader's
    harness does, on the rank), and the serial reference all 2N, from the same seed."""
    g = torch.Generator().manual_seed(seed * 64 + 1_000_003 + chunk)
    return (torch.randn(B, CHUNK, D, generator=g, dtype=DTYPE), torch.randn(B, CHUNK, D, generator=g, dtype=DTYPE))


def make_inputs(seed: int) -> dict:
    weights = init_transformer(1, D, 4 * D, seed, requires_grad=False)[0]
    pieces = [chunk_inputs(seed, c) for c in range(CHUNKS)]
    return {"seed": seed, "wqkv": weights.wqkv, "wo": weights.wo,
            "x": torch.cat([x for x, _ in pieces], dim=1), "target": torch.cat([t for _, t in pieces], dim=1)}


# ---- the serial reference, and the mistakes replayed on it

# Each variant is the serial attention with one common mistake in it; `replay` computes what an answer that makes
# it would return. "own queries" and "other ranks' queries" need the split (who holds which keys).
DIAGNOSES = {
    "only own queries": "each rank's dK and dV hold only its own queries' part: the gradients that the other ranks' "
                        "queries give a block never came home. In backward the block's dK/dV must travel with it "
                        "around the ring, each rank adding its part, and end where the block started",
    "own queries lost": "each rank's dK and dV hold every other rank's part but not its own queries': the block's "
                        "own gradient (step 0, its own queries against its own keys) was dropped when the "
                        "travelling dK/dV came home. Add what came home to it",
    "diagonal unmasked": "a query sees the keys after it within its own chunk: the tile of a chunk against itself "
                         "(the diagonal, where their chunk is mine) needs the causal mask (diagonal=True)",
    "empty tiles attended": "a query sees every key of the other chunks, the later ones too: the tiles whose key "
                            "chunk comes after the query chunk (their chunk > mine) must be skipped, not computed "
                            "without a mask",
    "blocks of the wrong rank": "the masks at steps 1 and 3 are the ones of the wrong block: at step s a rank holds "
                                "the block of rank (rank - s) mod N (blocks move right, rank r-1 to rank r), and its "
                                "chunks are load_balanced_chunks of that rank",
    "tiles summed": "each query's output is the sum of its tiles' outputs: partial softmaxes over different keys "
                    "were added without their weights. Merge with the log-sum-exps: out = exp(lse_a - lse)·out_a + "
                    "exp(lse_b - lse)·out_b with lse = logaddexp(lse_a, lse_b)",
}


def serial(inputs: dict, variant: str = "", split=None) -> dict:
    """The serial causal attention over the whole sequence (puzzles.model.causal_attention's ops), with the loss
    each rank backpropagates, summed: y, x.grad, and the gradients of qkv = x @ wqkv and of y, with the heads merged
    before wo (what each rank's wqkv.grad and wo.grad are made of)."""
    x = inputs["x"].detach().clone().requires_grad_()
    wqkv, wo = inputs["wqkv"].detach().clone().requires_grad_(), inputs["wo"].detach().clone().requires_grad_()
    qkv = x @ wqkv
    qkv.retain_grad()
    q, k, v = (t.view(B, S, HEADS, HD).transpose(1, 2) for t in qkv.split(D, dim=-1))
    scores = q @ k.transpose(-2, -1) / math.sqrt(HD)  # [b, heads, S, S]
    future = torch.ones(S, S, dtype=torch.bool).triu(1)
    chunk = torch.arange(S) // CHUNK
    if variant == "diagonal unmasked":
        future = chunk[None, :] > chunk[:, None]
    elif variant == "empty tiles attended":
        future = future & (chunk[None, :] == chunk[:, None])
    elif variant == "blocks of the wrong rank":
        future = misattributed_future(split)
    scores = scores.masked_fill(future, float("-inf"))
    if variant in ("only own queries", "own queries lost"):
        owner = owners(split)
        same = owner[:, None] == owner[None, :]  # query i and key j on the same rank
        grads_from = same if variant == "only own queries" else ~same
        detached = (q @ k.detach().transpose(-2, -1) / math.sqrt(HD)).masked_fill(future, float("-inf"))
        p = torch.softmax(torch.where(grads_from, scores, detached), dim=-1)
        out = (p * grads_from) @ v + (p * ~grads_from) @ v.detach()
    elif variant == "tiles summed":
        out = torch.zeros_like(q)
        for j in range(CHUNKS):  # each key chunk's softmax on its own, added up
            keys = slice(j * CHUNK, (j + 1) * CHUNK)
            part = scores[..., keys]
            seen = torch.isfinite(part).any(dim=-1, keepdim=True)
            p = torch.softmax(part.masked_fill(~seen, 0.0), dim=-1) * seen
            out = out + p @ v[..., keys, :]
    else:
        out = torch.softmax(scores, dim=-1) @ v
    merged = out.transpose(1, 2).reshape(B, S, D)
    merged.retain_grad()
    y = merged @ wo
    loss = ((y - inputs["target"]) ** 2).sum() / (B * TOKENS)  # each rank's loss_fn over its tokens, summed
    loss.backward()
    return {"y": y.detach(), "x_grad": x.grad, "dqkv": qkv.grad, "merged": merged.detach(),
            "dy": (2 * (y - inputs["target"]) / (B * TOKENS)).detach()}


def misattributed_future(split) -> torch.Tensor:
    """[S, S]: what rank r's masks hide when, at step s, it takes the block of rank r-s for rank r+s's: each key is
    masked as if it stood at the same place in the other rank's chunk."""
    future = torch.zeros(S, S, dtype=torch.bool)
    offset = torch.arange(CHUNK)
    for r in range(N):
        queries = positions(split[r])
        for owner in range(N):
            taken_for = (2 * r - owner) % N
            for true_chunk, fake_chunk in zip(split[owner], split[taken_for]):
                keys = true_chunk * CHUNK + offset
                future[queries[:, None], keys[None, :]] = (fake_chunk * CHUNK + offset)[None, :] > queries[:, None]
    return future


def expected_on(ref: dict, inputs: dict, chunks) -> dict:
    """What a rank holding `chunks` must return: its tokens' rows of y and x.grad, and its tokens' part of the
    weights' gradients (wqkv.grad = x_r^T·[dQ dK dV]_r, wo.grad = merged_r^T·dy_r: each rank's gradient of the
    weights is its own tokens' share; their sum is the serial gradient)."""
    at = positions(chunks)
    rows = lambda t: t[:, at].reshape(B * TOKENS, t.shape[-1])  # noqa: E731
    return {"y": ref["y"][:, at], "x_grad": ref["x_grad"][:, at],
            "wqkv_grad": rows(inputs["x"]).T @ rows(ref["dqkv"]), "wo_grad": rows(ref["merged"]).T @ rows(ref["dy"])}
