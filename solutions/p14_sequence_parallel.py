"""Puzzle 14 — Sequence parallelism (Megatron's tensor + sequence parallelism on the transformer block).

The task: two pre-norm transformer blocks (`transformer_block` in puzzles.model: an RMS norm, causal multi-head
attention, a residual add, an RMS norm, the MLP, a residual add) on 4 ranks. As in puzzle 4, the attention's heads
and the MLP's columns are split between the ranks (tensor parallelism). Unlike puzzle 4, the rest of the block is
split along the sequence: between the tensor-parallel regions, where the norms and the residual adds run, rank r
holds only its own tokens, 8·r to 8·r + 7 of each sequence (sequence parallelism).

The budgets, per rank (derived below; E = b·s·d·8 = 32,768 bytes, one [b, s, d] activation of the whole sequence):
  - activation memory: what the forward leaves alive for backward, 2 blocks of 230,656 bytes = 461,312, at most
    470,528 (+ a copy of the input shard + 1 KiB); plain tensor parallelism holds 659,456: sequence parallelism
    keeps 70% of it;
  - compute: exactly 1/N of the serial blocks' work, W/N + 1 = 10,419,537 FLOPs, at most 10,452,305 (+ 32,768 for
    bookkeeping), at least 10,223,616 of them in matrix products;
  - communication: what tensor parallelism's all-reduces move, 196,608 bytes each way: forward at most 197,632
    bytes, backward at most 200,704 (3,072 more for the norms' weight gradients; each + 1 KiB).

One block on rank r (N = 4; "[b, s/N, d]" is this rank's tokens, "[b, s, d]" the whole sequence):

    x_r ──┬── rms_norm ── all-gather ──> n ── rank r's heads ── @ wo_r ──> partial ── reduce-scatter ──(+)──> h_r
          │              (sequence)   [b, s, d]  (q, k, v: [b, s, 3d/N])   [b, s, d]   (sequence)      │
          └─────────────────────────────── residual, [b, s/N, d] ──────────────────────────────────────┘
    h_r ──┬── rms_norm ── all-gather ──> n ── @ w1_r ── gelu ── @ w2_r ──> partial ── reduce-scatter ──(+)──> y_r
          └─────────────────────────────── residual, [b, s/N, d] ──────────────────────────────────────┘

    backward: each all-gather's backward is a reduce-scatter, each reduce-scatter's backward an all-gather.

Why it works. In puzzle 4, every rank held the whole activation between the tensor-parallel regions, and g's
all-reduce put it there. A ring all-reduce is a reduce-scatter followed by an all-gather (puzzle 13 builds it
that way). Sequence parallelism keeps the two halves and moves the all-gather to just before the next
column-parallel product: after the reduce-scatter, rank r holds its own tokens of the summed output, runs the
residual add and the next norm on them (both act on each token alone), and the all-gather brings the whole
normalised sequence back for the heads or the MLP, which need every token (attention mixes them). Same bytes as
tensor parallelism: an all-gather plus a reduce-scatter of [b, s, d] move what one all-reduce does, 2(N-1)/N·E.
The conjugate pairs, as f and g were in puzzle 4:

    GatherFromSequenceParallel        forward: all-gather along the sequence   [b, s/N, d] -> [b, s, d]
                                      backward: reduce-scatter                  each rank's gradient of n is a
                                                                                partial sum (its heads, its columns)
    ReduceScatterToSequenceParallel   forward: reduce-scatter                   [b, s, d] partial -> [b, s/N, d]
                                      backward: all-gather                      every token's sum had a piece from
                                                                                every rank

The norms' weights are whole on every rank, but each rank applies them to its own tokens only: its gradient of
norm1 and norm2 is a partial sum over its tokens. All-reduce them in backward (a hook on each norm weight, or an
autograd Function that is the identity forward and all-reduces backward: puzzle 4's f, on a weight). Megatron
all-reduces them after the backward; GPT-NeoX, adding sequence parallelism in 2024, first forgot to, then averaged
them instead of summing (both are wrong here, and both train badly there).

Activation memory. With T = b·s tokens, per block and per rank, what autograd keeps for backward:

                                       sequence parallel          plain tensor parallel (puzzle 4)
    norm inputs, normalised values     2 · 2 · E/N                2 · 2 · E           (x and h, x·rms and h·rms)
    norms' 1/rms, [b, s, 1]            2 · b·(s/N)·8              2 · b·s·8
    the gathered norm outputs          2 · E                      2 · E               (the heads' and w1's input)
    q, k, v of the rank's heads        3 · E/N                    3 · E/N
    the heads' output (wo's input)     E/N                        E/N
    attention weights p, the mask      b·(a/N)·s²·8 + s²          b·(a/N)·s²·8 + s²
    x@w1_r and its gelu                2 · b·s·(h/N)·8            2 · b·s·(h/N)·8
    the block's output                 E/N                        E
    per block                          230,656 bytes              329,728 bytes

so 2·230,656 = 461,312 bytes for the two blocks (the last one's output y_r included), against plain tensor
parallelism's 659,456. Megatron saves even the gathered norm outputs' shards only, and all-gathers them again in
backward (overlapped with the input gradient's product): 363,008 bytes here, 55%, for one more all-gather per
region. This puzzle keeps the gathered input, so its bytes are exactly tensor parallelism's.

The layout. The sequence is dim 1 of [b, s, d], and the collectives cut and join dim 0 of a contiguous buffer:
`all_gather_into_tensor` of [b, s/N, d] pieces into an [N·b, s/N, d] buffer puts rank i's tokens in rows i·b to
(i+1)·b - 1; `from_sequence_chunks(chunks, N)` puts them side by side along the sequence (a copy). The other way,
`sequence_chunks(t, N)` lays [b, s, d] out as [N·b, s/N, d], so that block r, the one `reduce_scatter_tensor`
hands rank r, is rank r's tokens. (Megatron keeps its activations as [s, b, d] for this reason: the sequence is
dim 0, and no copy is needed.)

Write three things:
  - `GatherFromSequenceParallel`, a torch.autograd.Function: `GatherFromSequenceParallel.apply(x_r, dist)`
    returns the whole sequence [b, s, d], every rank's tokens in order; its backward reduce-scatters the gradient
    (and returns None for `dist`).
  - `ReduceScatterToSequenceParallel`, a torch.autograd.Function: `ReduceScatterToSequenceParallel.apply(partial,
    dist)` returns this rank's tokens of the sum of every rank's `partial`, [b, s/N, d]; its backward all-gathers
    the gradient along the sequence.
  - `sp_forward(dist, x, layers, n_heads) -> y`, run by every rank:
      - `x`: this rank's tokens of each sequence, [2, 8, 64] (requires_grad);
      - `layers`: this rank's pieces of each block's weights, a list of 2 TransformerWeights (requires_grad):
        norm1 and norm2 whole, [64]; wqkv the q, k and v columns of its 2 heads (heads 2r and 2r + 1), [64, 48];
        wo the matching rows, [16, 64]; w1 its 64 columns, [64, 64]; w2 the matching rows, [64, 64];
      - `n_heads`: 8, the heads of the whole block (this rank computes n_heads / N of them:
        `causal_attention(n, w.wqkv, w.wo, n_heads // N)` returns their share of the attention's output);
      - return y, this rank's tokens of the last block's output, [2, 8, 64].
The grader then computes the rank's share of the loss, `sequence_loss(y, target_r) / N` (the squared error summed
over features, averaged over all b·s tokens: the ranks' shares add up to the serial loss), on every rank, and calls
`backward()`.

Checks (sizes: N = 4 ranks; b = 2 sequences of s = 32 tokens, 8 per rank; d = 64, a = 8 heads of 8, h = 256;
L = 2 blocks):
  - output: y on rank r equals tokens 8r to 8r + 7 of the serial blocks' output.
  - input gradient: x.grad on rank r equals the same tokens of the serial x.grad.
  - weight gradients: rank r's wqkv, wo, w1 and w2 gradients equal its pieces of the serial ones.
  - norm gradients: norm1.grad and norm2.grad on every rank equal the serial ones, whole.
  - activation memory: the bytes alive on the rank right after sp_forward returns, less those before it was
    called, at most L·(2·E + 8·E/N + 2·b·s·(h/N)·8 + b·(a/N)·s²·8 + 2·b·(s/N)·8 + s²) + E/N + 1 KiB = 2·230,656 +
    8,192 + 1,024 = 470,528 bytes (the table above; E/N is room for one copy of the input shard, in [s, b, d]
    order say). A rank that runs the norms or keeps the residual on the whole sequence cannot fit; plain tensor
    parallelism holds 659,456.
  - compute: each rank computes exactly its 1/N of the serial blocks' work, forward and backward, every op counted:
    W/N + 1 = 10,419,537 FLOPs, W = L·(3·(8·T·d² + 4·T·d·h + 4·b·s²·d) + 34·T·d + 10·T + 13·Z + 2·T·h) + 3·T·d +
    T = 41,678,144 (the products qkv, wo, w1, w2, scores and p@v, forward and two backward; the norms, residual
    adds, the scores' scaling, mask and softmax, gelu and their backwards; the loss's backward; T = b·s = 64 tokens,
    Z = b·a·s² = 16,384 scores; + 1 for the backward of the grader's division by N), + 4·L·b·s·d = 32,768 for
    bookkeeping (room for the additions of the reduce-scatters and all-reduces, 3·L·b·s·d and a few hundred, if
    you write them with send and recv as in puzzle 13; the collectives add for free): at most 10,452,305 FLOPs. Plain tensor parallelism repeats the
    norms and residual adds of every token on every rank, 209,856 FLOPs more; recomputing in backward is more. No less than its matrix products, 10,223,616 FLOPs: products written
    as elementwise multiplies and sums are not allowed.
  - forward communication: the bytes each rank sends outside backward, summed over every collective (ring
    algorithm), at most L·2·2(N-1)/N·E + 1 KiB = 196,608 + 1,024 = 197,632 bytes: two all-gathers and two
    reduce-scatters of [b, s, d] per block, what tensor parallelism's two all-reduces move.
  - backward communication: the same inside backward, plus one all-reduce of the norms' weight gradients,
    L·2·2(N-1)/N·d·8 = 3,072 bytes: at most 196,608 + 3,072 + 1,024 = 200,704 bytes. An all-reduce where a
    reduce-scatter does moves twice the bytes; gathering the norm's output again in backward moves one all-gather
    more.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - Gather: `chunks = torch.empty((N * b, s // N, d), dtype=x.dtype)`, `dist.all_gather_into_tensor(chunks,
    x.contiguous())`, then `from_sequence_chunks(chunks, N)`. Reduce-scatter: `mine = torch.empty((b, s // N, d),
    dtype=...)`, `dist.reduce_scatter_tensor(mine, sequence_chunks(partial, N))`. (gloo takes exactly these shapes,
    the gathered [N·b, ...] for pieces [b, ...]; a stacked [N, b, ...], which torch documents and the simulator
    takes, gloo refuses.)
  - In a Function, keep `dist` on `ctx` in forward (`ctx.dist = dist`) and return one gradient per input of
    forward from backward: `return grad_x, None`.
  - A hook on a norm weight, `w.norm1.register_hook(fn)`, runs in backward with the weight's gradient and puts
    what fn returns in its place: all-reduce a copy of it (`g = grad.clone()`) and return that.
"""

import torch
import torch.nn.functional as F

from puzzles.model import causal_attention, rms_norm


def sequence_chunks(t, n):
    """[b, s, d] -> [n·b, s/n, d], contiguous: rows i·b to (i+1)·b - 1 hold tokens i·s/n to (i+1)·s/n - 1 of every
    sequence, the tokens rank i keeps. That is the layout the collectives cut and join along dim 0 (block i is rank
    i's); a copy, since the sequence is dim 1."""
    b, s, d = t.shape
    return t.reshape(b, n, s // n, d).transpose(0, 1).reshape(n * b, s // n, d)


def from_sequence_chunks(chunks, n):
    """[n·b, s/n, d] -> [b, s, d]: the n blocks side by side along the sequence again (a copy)."""
    nb, c, d = chunks.shape
    return chunks.view(n, nb // n, c, d).transpose(0, 1).reshape(nb // n, n * c, d)


class GatherFromSequenceParallel(torch.autograd.Function):
    """All-gather along the sequence forward, reduce-scatter backward (Megatron's
    gather_from_sequence_parallel_region): [b, s/N, d] on each rank -> [b, s, d] on every rank."""

    @staticmethod
    def forward(ctx, x, dist):
        # BEGIN SOLUTION
        ctx.dist = dist
        n = dist.get_world_size()
        chunks = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype)  # [N·b, s/N, d]
        dist.all_gather_into_tensor(chunks, x.contiguous())
        return from_sequence_chunks(chunks, n)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        dist = ctx.dist
        n = dist.get_world_size()
        mine = torch.empty((grad.shape[0], grad.shape[1] // n, grad.shape[2]), dtype=grad.dtype)  # [b, s/N, d]
        dist.reduce_scatter_tensor(mine, sequence_chunks(grad, n))
        return mine, None
        # END SOLUTION


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Reduce-scatter along the sequence forward, all-gather backward (Megatron's
    reduce_scatter_to_sequence_parallel_region): each rank's partial [b, s, d] -> this rank's tokens of the sum,
    [b, s/N, d]."""

    @staticmethod
    def forward(ctx, partial, dist):
        # BEGIN SOLUTION
        ctx.dist = dist
        n = dist.get_world_size()
        mine = torch.empty((partial.shape[0], partial.shape[1] // n, partial.shape[2]), dtype=partial.dtype)
        dist.reduce_scatter_tensor(mine, sequence_chunks(partial, n))
        return mine
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        dist = ctx.dist
        n = dist.get_world_size()
        chunks = torch.empty((n * grad.shape[0], *grad.shape[1:]), dtype=grad.dtype)
        dist.all_gather_into_tensor(chunks, grad.contiguous())
        return from_sequence_chunks(chunks, n), None
        # END SOLUTION


def sp_forward(dist, x, layers, n_heads):
    # BEGIN SOLUTION
    heads = n_heads // dist.get_world_size()

    def all_reduced(grad):  # a norm weight's gradient, from this rank's tokens only
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

    for w in layers:
        w.norm1.register_hook(all_reduced)
        w.norm2.register_hook(all_reduced)
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm1), dist)  # [b, s, d]
        x = x + ReduceScatterToSequenceParallel.apply(causal_attention(n, w.wqkv, w.wo, heads), dist)
        n = GatherFromSequenceParallel.apply(rms_norm(x, w.norm2), dist)
        x = x + ReduceScatterToSequenceParallel.apply(F.gelu(n @ w.w1) @ w.w2, dist)
    return x
    # END SOLUTION
