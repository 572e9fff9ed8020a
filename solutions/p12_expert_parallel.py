"""Puzzle 12 — Expert parallelism: a mixture of experts with all-to-all.

The task: a mixture-of-experts layer on 4 ranks that hold 8 experts between them, 2 each. Every rank routes its
own 16 tokens with a top-1 router, sends each token to the rank of its expert with `dist.all_to_all_single` (the
counts first, then the tokens, in uneven splits), applies its two experts to the tokens it receives, and sends the
results back to the ranks they came from. An expert takes at most C = 3 tokens from each rank; the rest are
dropped.

The budgets, per rank (derived below; one token's row is d·8 = 512 bytes):
  - expert weights: 1/N of all 8 experts', 2 experts of 131,072 bytes each: peak memory at most 806,912 bytes;
  - compute, every op counted: the router on its own 16 tokens plus its 2 experts on the tokens it receives and
    keeps, exactly these products, and at most the budget beside them (gelu's work and the routing's on top),
      products   rank 0: 2,211,840 FLOPs   rank 1: 1,425,408   rank 2: 1,032,192   rank 3: 638,976
      at most    rank 0: 2,340,352 FLOPs   rank 1: 1,551,872   rank 2: 1,157,632   rank 3: 763,392;
  - communication: the tokens that leave their rank, out and back, in forward and again in backward, plus 1 KiB for
    the counts: rank 0: 24,576 bytes   rank 1: 20,480   rank 2: 20,480   rank 3: 18,432.

The layer (Switch Transformer's, top-1):

    probs = softmax(x @ router)          x: [16, 64] on each rank, router: [64, 8] (every rank has a copy)
    e = argmax(probs), p = probs[e]      each token's expert and its gate probability
    y = x + p · expert_e(x)              expert_e(x) = gelu(x @ w1_e) @ w2_e,  w1_e: [64, 128], w2_e: [128, 64]
    y = x                                for a token its expert dropped (the residual alone, no expert's work)

Expert e lives on rank e // 2. The gate p is what makes the router learn: the output depends on the router only
through p, so its gradient flows through p.

Capacity: C = ceil(capacity_factor · n / E) = ceil(1.5 · 16 / 8) = 3, per expert and per rank: of the tokens a rank
routes to expert e, the first 3 in token order (row order of x) are kept and sent; the others are dropped where
they are (never sent, never computed, y = x). Capacity bounds the busiest rank's work at N·2·C = 24 tokens, however
skewed the router is.

The routing of the graded inputs. The router favours rank 0's experts, as a router does when nothing balances it
(the auxiliary loss that would, is another story). Which tokens go where is random at every seed, but these totals
are fixed, so the figures above are exact:

    tokens each rank keeps                         13 of its 16 (3 routed beyond capacity to a full expert)
    tokens that leave rank 0, 1, 2, 3 (S)           7,  9, 11, 12    (kept for experts on other ranks)
    tokens each rank receives from others (R)      16, 10,  8,  5
    tokens each rank computes (K)                  22, 14, 10,  6    (its own kept for its experts, plus R)

How many tokens each rank sends to each other rank changes from seed to seed: a rank learns what it will receive
only from the counts.

One step, on rank s:

    route    x --> e, p (16 tokens); keep the first C per expert; sort the kept tokens by expert
    counts   [tokens for expert 0, 1, ..., 7]  --all_to_all_single-->  [from rank 0: for my 2 experts | rank 1 | ...]
    dispatch [kept tokens for rank 0 | rank 1 | rank 2 | rank 3]  --all_to_all_single(out, in, out_splits,
             in_splits)-->  [from rank 0 | from rank 1 | from rank 2 | from rank 3]    (uneven splits)
    compute  each received token through its expert (the counts say which rows are whose)
    combine  the results --all_to_all_single, the splits swapped--> back to rank s, in the order it sent them
    output   y = x; y[kept] += p · result, each result in its own token's row

In backward the two all-to-alls run in reverse (the gradients of the results go to the experts' ranks, the
gradients of the tokens come back): an all-to-all's backward is the all-to-all with its splits swapped.

Load imbalance is on the clock. Rank 0 computes 22 tokens, rank 3 only 6: rank 0's compute takes 2,781 ticks,
rank 3's 1,243 (the router's and the routing's work is the same on every rank), and every rank waits for rank 0 in
the all-to-all that brings the results back:

    compute    rank 0  |router|================ experts: 22 tokens ================|
               rank 3  |router|== 6 tokens ==|.......... waits for rank 0 ...........|
                                                                                    ^ combine (all ranks)

The whole step takes 2,846 ticks: rank 0's 2,781 of compute and the all-to-alls. (Padding every rank's share of
every expert to C rows, as fixed-size buffers do, would balance the ranks by computing padding: 24 rows each, a
longer step, and more bytes. This puzzle sends and computes the tokens only.)

Write two things:
  - `AllToAll`, a torch.autograd.Function: `AllToAll.apply(x, dist, output_split_sizes, input_split_sizes)`
    returns the rows every rank sent this rank (rank i's chunk j goes to rank j), as
    `dist.all_to_all_single(output, x, output_split_sizes, input_split_sizes)`; its backward sends the gradient
    back the other way (the same call with the two split lists swapped).
  - `moe_forward(dist, x, router, experts, capacity_factor) -> y`, run by every rank:
      - `x`: this rank's 16 tokens, [16, 64] (requires_grad); `router`: [64, 8] (requires_grad; every rank has a
        copy); `experts`: this rank's 2 experts, a list of (w1 [64, 128], w2 [128, 64]) pairs with requires_grad,
        experts 2·rank and 2·rank + 1; `capacity_factor`: 1.5;
      - return y, [16, 64]. The grader computes `loss_fn(y, target)` (from puzzles.model) on every rank and calls
        `backward()`: the experts' gradients then hold every rank's tokens' contributions (they came through the
        all-to-alls), and the router's gradient on each rank its own tokens'.

The clock: the puzzles' GPU (README, "The clock"), CostModel(latency_ticks=0, bytes_per_tick=512): a token
through an expert, forward and backward, is 12·d·h + 2·h = 98,560 FLOPs, about 96 ticks of matmuls and a few of
gelu; a token's row (512 bytes) 1 tick on the wire; an all-to-all takes as long as its busiest rank's rows.

Checks (sizes: N = 4 ranks, E = 8 experts, 2 per rank; n = 16 tokens per rank; d = 64, h = 128; capacity factor
1.5, C = 3; W_E = 2·d·h·8 = 131,072 bytes per expert, all 8 experts 1,048,576 bytes of weights):
  - output: y on every rank equals the serial mixture of experts' output (the same routing, capacity and drops).
  - input gradient: x.grad on every rank equals the serial one.
  - router gradient: router.grad on every rank equals the serial gradient of that rank's loss.
  - expert gradients: every rank's experts' gradients equal the serial ones (all ranks' tokens included).
  - expert compute, every op counted: each rank computes the router's matmuls on its own tokens, 6·n·d·E = 49,152
    FLOPs (forward, and the two matmuls of its backward), plus 12·d·h = 98,304 FLOPs of matmuls per token it keeps
    for its experts: in products exactly 6·n·d·E + K·12·d·h, rank 0: 49,152 + 22·98,304 = 2,211,840 FLOPs; rank 1:
    1,425,408; rank 2: 1,032,192; rank 3: 638,976. All its FLOPs at most 6·n·d·E + K·(12·d·h + 2·h) + 12·d·h/4 +
    (N-1)·2·2·d·h, rank 0: 2,340,352; rank 1: 1,551,872; rank 2: 1,157,632; rank 3: 763,392: gelu both ways on
    each kept token (2·h), 12·d·h/4 = 24,576 FLOPs of room for the routing's elementwise work (softmax, top-1,
    positions, the gate's multiply, whatever way they are written), and (N-1)·2·2·d·h = 98,304 for adding each
    expert's weight gradients once per source rank (running the experts on each source's chunk apart). Of the
    elementwise work, at most K·h + 12·d·h/8 runs outside backward (the gelus and the routing's forward; rank 0:
    15,104): the room for accumulating gradients is autograd's, in backward. No more
    products: a rank that runs experts on padding, on dropped tokens, or on every token, or that dispatches with
    matrix products of one-hot masks, is over; no fewer: a product written as elementwise multiplies and sums costs
    as many FLOPs, none of them products, and a dispatch or combine written as one-hot masks multiplied in and
    summed (n·K·d multiplies and adds in forward) does not fit in the routing's room outside backward.
  - communication: the bytes each rank sends, over every collective and send (an all-to-all's wire bytes are what
    leaves the rank: the rows it keeps for itself are not sent), at most the tokens that leave it and the results
    it returns, in forward and again in backward, plus 1 KiB for the counts: 2·(S + R)·d·8 + 1 KiB, rank 0:
    2·(7 + 16)·512 + 1,024 = 24,576 bytes; rank 1: 2·(9 + 10)·512 + 1,024 = 20,480; rank 2: 2·(11 + 8)·512 +
    1,024 = 20,480; rank 3: 2·(12 + 5)·512 + 1,024 = 18,432. Padding every expert's share to C rows (GShard's
    fixed-size buffers), sending dropped tokens, or gathering all the tokens everywhere is over.
  - peak memory: each rank's peak at most 2·2·W_E + 2·d·E·8 + 4·n·d·8 + N·2·C·(3·d + 3·h)·8 + W_E = 806,912
    bytes: its 2 experts' weights and their gradients (1/N of all experts', 524,288 bytes), the router and its
    gradient, x, target, x.grad and y ([16, 64] each), per token it may receive (at most N·2·C = 24, whatever the
    routing) 3 rows of d (the token, its result, the token's gradient) and 3 of h (x@w1, its gelu, the gelu's
    gradient), and one expert's fresh weight gradients (W_E = 131,072 bytes) before autograd adds them into the
    ones it is accumulating: an expert may run once on all its rows, or once per source rank's chunk, or per token.
    A rank that holds all 8 experts (1,048,576 bytes of weights, as many again of gradients) cannot fit.
  - a deadlock, or an all-to-all whose split sizes do not agree between two ranks, is an error.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see): a list of a few split sizes (`counts.tolist()`) is fine.

Hints:
  - Top-1: `gate, choice = probs.max(dim=-1)`. The i-th token's position among those routed to its expert:
    `onehot = F.one_hot(choice, E)`, `position = (onehot.cumsum(0) * onehot).sum(1) - 1`; keep `position <
    capacity`.
  - Sort the kept tokens by expert (`torch.argsort(choice[kept], stable=True)`): the rows for rank d are then
    one block, experts 2d then 2d+1. `torch.bincount(choice[kept], minlength=E)` counts them.
  - Exchange the counts per expert (8 numbers out, 8 in: 2 from each rank), then size the tokens' all-to-all:
    input_split_sizes from your counts, output_split_sizes from the counts you received.
  - Put results back in token order with an index: `torch.zeros_like(x).index_copy(0, kept_rows, p * results)`.
"""

import math

import torch
import torch.nn.functional as F


class AllToAll(torch.autograd.Function):
    """Rows out to every rank by split sizes; backward sends the gradients back with the splits swapped."""

    @staticmethod
    def forward(ctx, x, dist, output_split_sizes, input_split_sizes):
        # BEGIN SOLUTION
        ctx.dist, ctx.splits = dist, (list(output_split_sizes), list(input_split_sizes))
        out = x.new_empty((sum(output_split_sizes), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), list(output_split_sizes), list(input_split_sizes))
        return out
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        received, sent = ctx.splits
        back = grad.new_empty((sum(sent), *grad.shape[1:]))
        ctx.dist.all_to_all_single(back, grad.contiguous(), sent, received)
        return back, None, None, None
        # END SOLUTION


def moe_forward(dist, x, router, experts, capacity_factor):
    # BEGIN SOLUTION
    world, local = dist.get_world_size(), len(experts)
    n, n_experts = x.shape[0], world * local
    capacity = math.ceil(capacity_factor * n / n_experts)
    gate, choice = torch.softmax(x @ router, dim=-1).max(dim=-1)  # top-1: each token's p and expert
    onehot = F.one_hot(choice, n_experts)
    position = (onehot.cumsum(0) * onehot).sum(1) - 1  # the token's place among those routed to its expert
    kept = torch.nonzero(position < capacity).squeeze(1)  # the first C per expert, in token order
    kept = kept[torch.argsort(choice[kept], stable=True)]  # sorted by expert: rank d's block is experts 2d, 2d+1

    sent_counts = torch.bincount(choice[kept], minlength=n_experts)  # [E]: tokens for each expert
    received_counts = torch.empty_like(sent_counts)  # [world * local]: from each rank, for each of my experts
    dist.all_to_all_single(received_counts, sent_counts)
    send_splits = sent_counts.view(world, local).sum(1).tolist()
    recv_splits = received_counts.view(world, local).sum(1).tolist()

    tokens = AllToAll.apply(x[kept], dist, recv_splits, send_splits)  # [sum(recv_splits), d], by source
    whose = torch.arange(local).repeat(world).repeat_interleave(received_counts)  # each row's local expert
    by_expert = torch.argsort(whose, stable=True)
    outputs = torch.cat([F.gelu(part @ w1) @ w2 for part, (w1, w2) in
                         zip(tokens[by_expert].split(torch.bincount(whose, minlength=local).tolist()), experts)])
    results = outputs[torch.argsort(by_expert)]  # back in the order the rows arrived

    returned = AllToAll.apply(results, dist, send_splits, recv_splits)  # [len(kept), d], in the order sent
    return x + torch.zeros_like(x).index_copy(0, kept, gate[kept].unsqueeze(1) * returned)
    # END SOLUTION
