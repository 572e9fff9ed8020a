"""p12's sizes, the routing every seed is built to have, and the serial mixture of experts (with the common
mistakes replayed, to name a wrong answer).

The routing. Which tokens go to which expert is random for every seed (the tokens' values, their order, which of a
rank's two experts takes them, how many each source sends to each other rank), but a few totals are fixed, so that
every figure the grader checks is the same number at every seed and can be printed in the puzzle's text:

    KEPT[s][d]  tokens rank s keeps for rank d's experts, within capacity:

                 to rank 0   1   2   3   | kept  sent away (S)
    rank 0            6      3   2   2   |  13     7
    rank 1            6      4   2   1   |  13     9
    rank 2            5      4   2   2   |  13    11
    rank 3            5      3   4   1   |  13    12
    computed (K)     22     14  10   6   |  52 of 64 tokens; 3 per rank dropped
    received (R)     16     10   8   5      (from the other ranks)

The margins (each rank's kept tokens, what it sends away, what it computes and receives) stay put; the entries off
the diagonal move at random from seed to seed (2x2 exchanges that keep the margins), so the split sizes a rank
receives cannot be known without exchanging the counts. Every rank routes 3 tokens beyond capacity, to an expert
that already keeps C = 3 of its tokens: they are dropped. The skew towards rank 0's experts (the router's
favourites, here by construction) is what makes rank 0 the busiest.

The tokens are made to route that way: the router's columns are orthonormal directions q_e (times a scale), and a
token bound for expert e is alpha·q_e plus noise, resampled until its largest logit is e's by a clear margin.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from puzzles.model import init_layers, loss_fn

N, E, N_TOKENS, DIM, H = 4, 8, 16, 64, 128  # ranks, experts, tokens per rank, d, h
LOCAL = E // N  # experts per rank: expert e lives on rank e // LOCAL
FACTOR = 1.5
CAPACITY = math.ceil(FACTOR * N_TOKENS / E)  # 3: tokens each expert accepts from each rank
BASE = [[6, 3, 2, 2], [6, 4, 2, 1], [5, 4, 2, 2], [5, 3, 4, 1]]
DROPPED = N_TOKENS - sum(BASE[0])  # 3 per rank
KEPT_ON = [sum(BASE[s][d] for s in range(N)) for d in range(N)]  # K: [22, 14, 10, 6], tokens each rank computes
SENT_AWAY = [sum(BASE[s]) - BASE[s][s] for s in range(N)]  # S: [7, 9, 11, 12]
RECEIVED = [KEPT_ON[d] - BASE[d][d] for d in range(N)]  # R: [16, 10, 8, 5]
ROW = DIM * 8  # bytes of one token's row
TOKEN_FLOPS = 12 * DIM * H  # one token through one expert: 2 forward, 4 backward matmuls of 2·d·h
TOKEN_WORK = TOKEN_FLOPS + 2 * H  # the same with gelu and its backward on the token's h hidden units
ROUTER_FLOPS = 6 * N_TOKENS * DIM * E  # x @ router forward, and its two backward matmuls
ALPHA, NOISE, MARGIN = 2.0, 0.5, 0.25


def kept_matrix(rng: random.Random) -> list[list[int]]:
    """BASE with its off-diagonal entries moved by 2x2 exchanges that keep every row and column sum and the
    diagonal: +1 at (s1, d1) and (s2, d2), -1 at (s1, d2) and (s2, d1), with {d1, d2} the other two ranks."""
    kept = [row[:] for row in BASE]
    for _ in range(40):
        s1, s2 = rng.sample(range(N), 2)
        d1, d2 = [d for d in range(N) if d not in (s1, s2)]
        if rng.random() < 0.5:
            d1, d2 = d2, d1
        if kept[s1][d1] < 2 * CAPACITY and kept[s2][d2] < 2 * CAPACITY and kept[s1][d2] > 0 and kept[s2][d1] > 0:
            kept[s1][d1] += 1
            kept[s2][d2] += 1
            kept[s1][d2] -= 1
            kept[s2][d1] -= 1
    return kept


def expert_counts(rng: random.Random) -> list[list[int]]:
    """counts[s][e]: tokens rank s routes to expert e (kept and dropped): KEPT split between each rank's two
    experts (at most CAPACITY each), and each rank's DROPPED tokens routed to an expert that is already full."""
    while True:
        kept = kept_matrix(rng)
        counts, ok = [], True
        for s in range(N):
            full = [d for d in range(N) if kept[s][d] >= CAPACITY]
            if not full:
                ok = False
                break
            hot = 0 if 0 in full else rng.choice(full)  # the drops go to rank 0's experts when they can
            row = []
            for d in range(N):
                k = kept[s][d]
                if d == hot:
                    first = rng.random() < 0.5
                    split = (CAPACITY, k - CAPACITY) if first else (k - CAPACITY, CAPACITY)
                    split = (split[0] + DROPPED * first, split[1] + DROPPED * (not first))
                else:
                    a = rng.randint(max(0, k - CAPACITY), min(CAPACITY, k))
                    split = (a, k - a)
                row += list(split)
            counts.append(row)
        if ok:
            return counts


def make_inputs(seed: int) -> dict:
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(DIM, E, generator=g, dtype=torch.float64))  # orthonormal columns
    router = q.clone()
    counts = expert_counts(rng)
    xs = []
    for s in range(N):
        chosen = [e for e in range(E) for _ in range(counts[s][e])]
        rng.shuffle(chosen)
        rows = []
        for e in chosen:
            while True:
                z = torch.randn(DIM, generator=g, dtype=torch.float64)
                token = z - q @ (q.T @ z) + q @ (NOISE * torch.randn(E, generator=g, dtype=torch.float64))
                token = token + ALPHA * q[:, e]
                logits = token @ router
                top = torch.topk(logits, 2).values
                if int(logits.argmax()) == e and float(top[0] - top[1]) > MARGIN:
                    rows.append(token)
                    break
        xs.append(torch.stack(rows))
    targets = [torch.randn(N_TOKENS, DIM, generator=g, dtype=torch.float64) for _ in range(N)]
    return {"x": xs, "target": targets, "router": router, "experts": init_layers(E, DIM, H, seed + 1),
            "counts": counts}


def expert(x, w1, w2):
    return F.gelu(x @ w1) @ w2


def moe(inputs, variant: str = "") -> list[dict]:
    """Each rank's y, x.grad, router.grad, and (on every rank) the gradients of its own experts, when the serial
    mixture of experts runs every rank's tokens; `variant` replays a common mistake instead."""
    experts = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
               for w1, w2 in inputs["experts"]]
    out = []
    total = 0
    for s in range(N):
        x = inputs["x"][s].detach().clone().requires_grad_()
        router = inputs["router"].detach().clone().requires_grad_()
        probs = torch.softmax(x @ router, dim=-1)
        gate, choice = probs.max(dim=-1)
        if variant == "gate detached":
            gate = gate.detach()
        y_rows = []
        seen = [0] * E
        order = range(N_TOKENS - 1, -1, -1) if variant == "last kept" else range(N_TOKENS)
        keep = [False] * N_TOKENS
        for i in order:
            e = int(choice[i])
            keep[i] = seen[e] < CAPACITY or variant == "no capacity"
            seen[e] += 1
        kept = [i for i in range(N_TOKENS) if keep[i]]
        branch = {i: expert(x[i:i + 1], *experts[int(choice[i])]) for i in kept}
        by_expert = sorted(kept, key=lambda i: int(choice[i]))  # the order they are sent in
        result_of = dict(zip(kept, by_expert)) if variant == "unsorted" else {i: i for i in kept}
        for i in range(N_TOKENS):
            if keep[i]:
                b = branch[result_of[i]]
                y_rows.append(x[i:i + 1] + (b if variant == "no gate" else gate[i] * b))
            else:
                y_rows.append(torch.zeros_like(x[i:i + 1]) if variant == "dropped zero" else x[i:i + 1])
        y = torch.cat(y_rows)
        total = total + loss_fn(y, inputs["target"][s])
        out.append({"y": y, "x": x, "router": router})
    total.backward()

    def grad(w):  # a weight no token reached has no .grad; the answer's (zeroed by the grader) stays zero
        return w.grad if w.grad is not None else torch.zeros_like(w)

    return [{"y": o["y"].detach(), "x_grad": o["x"].grad, "router_grad": grad(o["router"]),
             "grads": [(grad(experts[s * LOCAL + j][0]), grad(experts[s * LOCAL + j][1])) for j in range(LOCAL)]}
            for s, o in enumerate(out)]


VARIANTS = {
    "no capacity": "every token went to its expert: the capacity was not applied. Each expert accepts at most "
                   f"C = ceil(factor·n/E) = {CAPACITY} tokens from each rank, the first {CAPACITY} in token order; "
                   "the others are dropped (their output is x, the residual alone)",
    "last kept": f"the capacity kept the last {CAPACITY} tokens routed to each expert instead of the first: tokens "
                 "are dropped in token order, so the first C routed to an expert are kept",
    "dropped zero": "a dropped token's output is zero; it should be x itself (the residual: no expert adds to it)",
    "no gate": "the expert's output is added without the gate: y = x + p·expert(x), with p the router's "
               "probability of the chosen expert (the router learns only through p)",
    "unsorted": "the results came back in the order the tokens were sent (sorted by expert), but were put into "
                "the kept tokens' rows in token order: token i got another token's result. Index the results with "
                "the same (sorted) token indices they were sent with",
    "gate detached": "the router's gradient is cut: the gate probability p was detached (or taken from a tensor "
                     "that does not require grad), so no gradient reaches the router through y = x + p·expert(x)",
}


def kept_totals(counts) -> list[list[int]]:
    """KEPT[s][d] of the counts (what the figures rest on), for checking make_inputs."""
    return [[sum(min(counts[s][d * LOCAL + j], CAPACITY) for j in range(LOCAL)) for d in range(N)] for s in range(N)]
