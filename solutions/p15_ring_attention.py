r"""Puzzle 15 — Context parallelism: ring attention.

The task: causal self-attention over a sequence too long for one rank, on 4 ranks. Each rank holds S/N = 96 of
the S = 384 tokens: their queries, and its own block of keys and values (K/V). The K/V blocks travel around the
ring with isend/irecv (rank r sends to r+1 and receives from r-1) while each rank computes its queries' attention
against the block it holds, merging the partial results with the online softmax; backward passes the blocks
around again, and each block's gradient dK/dV travels with it, every rank adding its part, and comes home. The
sequence is split so that the causal mask leaves every rank the same work: of 2N = 8 chunks, rank i holds chunk i
and chunk 2N-1-i.

The budgets, per rank (derived below; Q = 49,152 bytes is one rank's [b, S/N, d], a K/V block is KV = 2·Q = 98,304
bytes, a tile of scores [b, h, c, c] is T = 73,728 bytes, the weights wqkv and wo are W = 32,768 bytes):
  - K/V blocks: at every message, other ranks' data still alive is at most 2 K/V blocks outside backward, 2·KV +
    1 KiB = 197,632 bytes, and 2 K/V and 2 dK/dV blocks in backward, 4·KV + 1 KiB = 394,240 bytes;
  - what the forward leaves alive for the backward at most 8·Q + 1 KiB = 394,240 bytes (q, k, v, out and lse, the
    merged heads, y: no scores, no other rank's block); peak memory at most 2·W + 24·Q + 16·T + 1 KiB = 2,425,856
    bytes: O(S/N) and one step's scores, never the scores of a rank's queries against every key;
  - compute at most 27,230,208 FLOPs (the 2N+1 = 9 tiles the mask leaves a rank, not the 16 of its queries' rows),
    at least 20,643,840 of them in products;
  - balance: the busiest rank computes at most 5.0% more FLOPs than the least busy one;
  - bytes sent: exactly N-1 K/V blocks in forward, 294,912 bytes (at most 295,936), and N-1 K/V blocks and N-1
    dK/dV blocks in backward, 589,824 bytes (at most 590,848); round the ring: in forward every block goes to a
    ring neighbour (r+1, or r-1 for a ring turned the other way) by send, in backward the K/V blocks again (what
    goes elsewhere at most the N-1 dK/dV blocks, which may go straight home);
  - makespan: the communication left exposed at most one block's transfer and 2% of a rank's compute, 784 + 687
    = 1,471 ticks: every message but the last hides behind the tiles (copies or clones run while a message is in
    flight hide nothing: only work with arithmetic hides a message).

The split. Cut the sequence into 2N chunks of c = S/2N = 48 tokens, and attention into c x c tiles (a query chunk
against a key chunk). Under the causal mask query chunk i sees key chunks 0..i: i full tiles and the diagonal
one, half masked. The rest of its row is empty and costs nothing once skipped:

                  key chunk  0 1 2 3 4 5 6 7      # a full tile   \ the diagonal (causal inside)   . empty
    query chunk 0 (rank 0)   \ . . . . . . .
                1 (rank 1)   # \ . . . . . .      load balanced: rank i holds chunks i and 2N-1-i, whose
                2 (rank 2)   # # \ . . . . .      queries see (i + 1) + (2N - i) = 2N + 1 = 9 tiles, on every rank
                3 (rank 3)   # # # \ . . . .
                4 (rank 3)   # # # # \ . . .      contiguous (rank r: chunks 2r, 2r+1): 3, 7, 11 and 15 tiles;
                5 (rank 2)   # # # # # \ . .      rank 3 has 5x rank 0's tiles, and every step waits for it
                6 (rank 1)   # # # # # # \ .
                7 (rank 0)   # # # # # # # \

Rank r's tokens are chunk i's then chunk j's, (i, j) = load_balanced_chunks(r, N): its q, k, v are [b, heads,
2c, hd], the first c positions chunk i, the last c chunk j. A block that comes from rank s holds s's chunks.

The ring, forward. At step s rank r holds the block of rank (r - s) mod N. It posts the isend of that block to
r+1 and the irecv of the next from r-1, computes its queries' tiles against the block (each query chunk against
each key chunk it sees), and only then waits: the next block arrives while it computes. N-1 exchanges, none
after the last step.

    compute  |tiles vs block r  |tiles vs block r-1|tiles vs block r-2|tiles vs block r-3|
    send     |== block r   ==>  |== block r-1 ==>  |== block r-2 ==>  |
    receive  |<== block r-1 ==  |<== block r-2 ==  |<== block r-3 ==  |

The online softmax. attention_tile(q, k, v, diagonal) gives one tile's (out, lse): the attention over that tile's
keys alone, and the log of its softmax's denominator, lse = log Σ exp(scores). Two results over different keys
merge exactly, each weighted by its share of the whole denominator:

    lse = log(exp(lse_a) + exp(lse_b))            torch.logaddexp: the running max is taken out first, no overflow
    out = exp(lse_a - lse)·out_a + exp(lse_b - lse)·out_b

Merged over every tile a query chunk sees, out is its attention output and lse the log-sum-exp over all its keys.

The ring, backward. attention_tile_backward(q, k, v, out, lse, grad_out, diagonal) gives one tile's (dq, dk, dv)
from the query chunk's final out and lse (the scores are computed again, not kept). dq is mine: it adds up here.
dk and dv belong to the block's owner, and every rank whose queries see the block adds a part. So the blocks go
around again, and each block's gradient travels one step behind it:

    step 0       my queries against my own block: that part of my block's gradient stays home
    step 1       block r-1 arrives: my part of its gradient starts its travelling sum, sent right
    step s > 1   block r-s arrives, and from the left the travelling sum of its gradient: add my part, send it right
    the end      the travelling sum of my own block arrives from the left, after N-1 hops: add it to what stayed home

Backward sends N-1 K/V blocks and N-1 dK/dV blocks. A sum that starts at home and makes N hops sends one block
more: over budget.

The clock: CostModel(latency_ticks=8, bytes_per_tick=128), the puzzles' GPU (1,024 FLOPs a tick, 2,048 bytes a
tick of memory bandwidth, 4 ticks per kernel). Sending one block, K and V apart, takes 2·(8 + Q/128) = 784 ticks;
a step's tiles take about 1,970 ticks in forward (two tiles of 854 and their merges) and 4,100 in backward (two
tiles of 2,011): the messages hide behind the tiles when they are posted first. What cannot hide is the last
dK/dV hop home, after which nothing is left to compute: one block's transfer. C = 34,365 ticks is a rank's
compute: the projections forward and backward, 9 tiles forward with their merges, and 9 backward (the tiles of
the diagonal step slightly dearer, masked). Waiting for each block before computing with it (wait() right after
isend and irecv) exposes every transfer, 8 blocks' worth (6,272 ticks); all-gathering K and V before the tiles and
reduce-scattering dK/dV after them, 6 (4,704 ticks); both over the budget of 1,471. (Blocking sends all around the
ring, each rank sending before it receives, never finish: every send waits for a receive not yet posted.)

Memory. After the forward a rank keeps what its backward needs and nothing else: q, k, v and out (4·Q), lse, the
heads merged before wo (kept by the output projection) and y (2·Q): 297,984 bytes, under 8·Q + 1 KiB. Keeping
each tile's scores for the backward would add 9·T = 663,552 bytes (attention_tile_backward computes them again from
lse instead); keeping the other ranks' blocks, 3·KV. At its peak (in backward, the reference solution) a rank holds
the weights and their gradients (2·W = 65,536 bytes), x and target, what the forward kept, dy and dq, the K/V block
it computes with and the one arriving (4·Q), four dK/dV blocks (home, the one it adds into, the one leaving, the
one arriving: 8·Q) and one tile's work (its scores, softmax and their gradients): 1,470,992 bytes. The budget
leaves room for a step computed whole (4 tiles at once, 16·T with the softmax and gradients); the scores of a
rank's queries against every key, [b, h, S/N, S], are 16·T for one tensor, and a softmax needs two. At N = 4 the
blocks in flight weigh about what all N K/V blocks would; as N grows they stay put while N blocks grow with the
sequence. That is why the first rule counts the blocks: gathering K and V (all_gather_into_tensor) holds all N.

Compute. One tile's product (q·kᵀ or p·v) is 2·b·h·c·c·hd = 2·b·c²·d = 294,912 FLOPs; a tile takes 2 in forward
and, in backward, the serial model's 4 (dv = pᵀ·dout, dp = dout·vᵀ, dq = ds·k, dk = dsᵀ·q) plus the scores again.
The projections (x @ wqkv and the merged heads @ wo, forward and backward) are 24·b·(S/N)·d² = 4,718,592 FLOPs.
  - at most 24·b·(S/N)·d² + (2N+2)·(7·2·b·c²·d + 16·b·h·c²) + 16·N·b·(S/N)·d = 27,230,208 FLOPs: up to 2N+2 = 10
    tiles (computing your own block whole, its empty tile included, is allowed), 16 FLOPs per score for the mask,
    the softmax and their gradients, and 16 per element of a [b, S/N, d] per step for the merges and sums;
  - at least 24·b·(S/N)·d² + (2N+1)·6·2·b·c²·d = 20,643,840 FLOPs in products (matmuls): the 9 tiles' products.
  Computing every tile of every block under a mask is 16 tiles; the last rank of a contiguous split computes 15.

Write four things:
  - `load_balanced_chunks(rank, world_size) -> (i, j)`: the two of the 2N chunks `rank` holds. The grader calls it
    on every rank to hand each rank its tokens (x, [b, 2c, d]: chunk i's tokens, then chunk j's), so it must give
    every chunk to exactly one rank; your RingAttention calls it to know which positions a block holds.
  - `merge(out, lse, tile_out, tile_lse) -> (out, lse)`: the online softmax's merge of two partial results.
  - `RingAttention`, a torch.autograd.Function: `RingAttention.apply(q, k, v, dist)`, with q, k, v this rank's
    [b, heads, S/N, hd] (contiguous), returns out, [b, heads, S/N, hd]; its backward returns (dq, dk, dv, None),
    dk and dv the gradient of this rank's own block (every rank's queries' parts summed).
  - `context_parallel_attention(dist, x, wqkv, wo, n_heads) -> y`: puzzles.model.causal_attention for this rank's
    tokens: q, k, v = x @ wqkv split in three and into heads, RingAttention, the heads merged, @ wo. x: [2, 96, 32]
    (requires_grad), wqkv: [32, 96], wo: [32, 32] (every rank has a copy, requires_grad), n_heads: 2. Returns y,
    [2, 96, 32]. The grader computes loss_fn over y's rows and calls backward(): x.grad, wqkv.grad and wo.grad then
    hold this rank's tokens' share (the ranks' shares add up to the serial gradient; in training they would be
    all-reduced with the data-parallel gradients, not here).
Given in puzzles.model: attention_tile and attention_tile_backward (one tile, forward and backward).

Checks (sizes: N = 4 ranks, b = 2, S = 384 tokens, d = 32, h = 2 heads of hd = 16; 2N = 8 chunks of c = 48; every
rank's share S/N = 96 tokens):
  - output: y on every rank equals the serial causal attention's rows at its tokens;
  - input gradient: x.grad on every rank, the same;
  - q/k/v gradients: wqkv.grad's query, key and value columns, x_rᵀ·dQ_r, x_rᵀ·dK_r and x_rᵀ·dV_r: a key or value
    gradient that did not come home is wrong here;
  - output projection gradient: wo.grad;
  - K/V blocks, peak memory, forward memory, compute, balance, forward and backward communication, makespan: the
    budgets above
    (the makespan on the simulator only: real processes have no clock that means the same everywhere);
  - a split that does not give each chunk to exactly one rank is an error; a deadlock is an error;
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - isend and irecv return handles; wait() for them after the block's tiles, not before. A finished handle, a view
    (say, a chunk of the block) or a variable that outlives its step keeps its block alive: let them go before the
    next exchange, or the rank holds three blocks.
  - A tile whose key chunk comes after its query chunk (their chunk > mine) is empty: skip it; the diagonal tile
    (their chunk == mine) is masked.
  - `tensor.chunk(2, dim=-2)` splits a rank's [b, heads, 2c, hd] into its two chunks, as views: adding into a view
    (`dq.chunk(2, dim=-2)[i].add_(...)`) adds into the whole tensor.
"""

import torch

from puzzles.model import attention_tile, attention_tile_backward


def load_balanced_chunks(rank, world_size):
    # BEGIN SOLUTION
    return rank, 2 * world_size - 1 - rank
    # END SOLUTION


def merge(out, lse, tile_out, tile_lse):
    # BEGIN SOLUTION
    total = torch.logaddexp(lse, tile_lse)
    return torch.exp(lse - total) * out + torch.exp(tile_lse - total) * tile_out, total
    # END SOLUTION


def wait_all(works):
    """Wait for every handle. (In a function of its own, so that no name is left holding the last one: a finished
    handle may still hold its buffer, as gloo's do.)"""
    for work in works:
        work.wait()


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dist):
        # BEGIN SOLUTION
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        mine = load_balanced_chunks(rank, world)
        outs, lses = [None, None], [None, None]  # per query chunk: its tiles so far, merged
        block = (k, v)
        for step in range(world):
            theirs = load_balanced_chunks((rank - step) % world, world)  # the chunks of the block I hold
            if step < world - 1:  # the next block arrives while I compute with this one
                arriving = (torch.empty_like(k), torch.empty_like(v))
                works = [dist.isend(block[0], right), dist.isend(block[1], right),
                         dist.irecv(arriving[0], left), dist.irecv(arriving[1], left)]
            for i, j in [(i, j) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]:
                out, lse = attention_tile(q.chunk(2, dim=-2)[i], block[0].chunk(2, dim=-2)[j],
                                          block[1].chunk(2, dim=-2)[j], theirs[j] == mine[i])
                outs[i], lses[i] = (out, lse) if outs[i] is None else merge(outs[i], lses[i], out, lse)
            if step < world - 1:
                wait_all(works)
                block, works = arriving, None  # the block I sent goes: nothing refers to it any more
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)
        ctx.dist = dist
        ctx.save_for_backward(q, k, v, out, lse)
        return out
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        # BEGIN SOLUTION
        q, k, v, out, lse = ctx.saved_tensors
        dist = ctx.dist
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        mine = load_balanced_chunks(rank, world)
        dq = torch.zeros_like(q)
        block, home, arriving_grad, leaving = (k, v), None, None, None
        for step in range(world):
            theirs = load_balanced_chunks((rank - step) % world, world)
            if step < world - 1:
                arriving = (torch.empty_like(k), torch.empty_like(v))
                works = [dist.isend(block[0], right), dist.isend(block[1], right),
                         dist.irecv(arriving[0], left), dist.irecv(arriving[1], left)]
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # this block's gradient from my queries
            for i, j in [(i, j) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]:
                grads = attention_tile_backward(
                    q.chunk(2, dim=-2)[i], block[0].chunk(2, dim=-2)[j], block[1].chunk(2, dim=-2)[j],
                    out.chunk(2, dim=-2)[i], lse.chunk(2, dim=-2)[i], grad_out.chunk(2, dim=-2)[i], theirs[j] == mine[i])
                dq.chunk(2, dim=-2)[i].add_(grads[0])
                dk.chunk(2, dim=-2)[j].add_(grads[1])
                dv.chunk(2, dim=-2)[j].add_(grads[2])
            if step == 0:
                home = (dk, dv)  # my own block's gradient from my own queries: it stays here
            else:
                if arriving_grad is not None:  # what the ranks before me added to this block's gradient
                    wait_all(grad_works)
                    dk += arriving_grad[0]
                    dv += arriving_grad[1]
                    grad_works = None  # a finished handle may still hold its buffer (gloo's do): let them go
                if leaving is not None:
                    wait_all(leaving)
                leaving = [dist.isend(dk, right), dist.isend(dv, right)]  # on; after the last step, home
                arriving_grad = (torch.empty_like(k), torch.empty_like(v))
                grad_works = [dist.irecv(arriving_grad[0], left), dist.irecv(arriving_grad[1], left)]
            if step < world - 1:
                wait_all(works)
                block, works = arriving, None
        wait_all(grad_works + leaving)
        del grad_works, leaving
        return dq, home[0] + arriving_grad[0], home[1] + arriving_grad[1], None
        # END SOLUTION


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    # BEGIN SOLUTION
    b, s, d = x.shape
    q, k, v = (x @ wqkv).split(d, dim=-1)

    def heads(t):  # [b, s, d] -> [b, heads, s, hd], contiguous: it is sent as it is
        return t.view(b, s, n_heads, d // n_heads).transpose(1, 2).contiguous()

    out = RingAttention.apply(heads(q), heads(k), heads(v), dist)
    return out.transpose(1, 2).reshape(b, s, d) @ wo
    # END SOLUTION
