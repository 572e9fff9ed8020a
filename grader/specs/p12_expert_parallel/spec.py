"""p12 expert parallelism: a top-1 mixture of experts on 4 ranks, 8 experts, 2 per rank, tokens exchanged with
all-to-all in uneven splits, capacity with token dropping.

The rules, each measured as such: the output, the input's, the router's and the experts' gradients against the
serial mixture of experts; each rank's compute (exactly the router on its own tokens and its experts on the tokens
it keeps: that is where load imbalance shows, on the clock); the bytes each rank sends (the tokens that leave it and
the results it returns, in forward and backward, whatever collectives carry them); and the peak memory (expert
weights 1/N). The inputs are built so that these figures are the same at every seed (routing.py); the
common mistakes are replayed on the serial model to name a wrong answer."""

from __future__ import annotations

import torch

from puzzles.model import loss_fn
from puzzles.sim import CostModel

from ...core.compare import safe_diagnosis, tensor_mismatch, values_check
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, describe_sent, flops, product_flops, products_short, sent, sized_like
from ...core.spec import Observation, PuzzleSpec, pair_at
from .routing import (CAPACITY, DIM, DROPPED, E, FACTOR, KEPT_ON, LOCAL, N, N_TOKENS, RECEIVED, ROUTER_FLOPS, ROW,
                      SENT_AWAY, TOKEN_FLOPS, TOKEN_WORK, VARIANTS, H, make_inputs, moe)

W_E = 2 * DIM * H * 8  # one expert's weights
MOST_RECEIVED = N * LOCAL * CAPACITY  # the most tokens a rank can be sent: C from each rank for each of its experts
# The last W_E: one expert's fresh weight gradients (w1's and w2's) before autograd adds them into the ones it is
# accumulating, for an expert run on several pieces (once per source rank's chunk, or per token: measured, 753,528
# and 756,600 bytes on rank 0 against the reference's 597,544). The text never asks for one product per expert.
PEAK = (2 * LOCAL * W_E + 2 * DIM * E * 8 + 4 * N_TOKENS * DIM * 8 + MOST_RECEIVED * (3 * DIM + 3 * H) * 8
        + W_E)


# Room for the routing's elementwise work, whatever way it is written (softmax, the top-1, the positions, the
# gate's multiply and their backward: about 12,600 FLOPs in the reference), well under one token's expert work.
ROUTING_ALLOWANCE = TOKEN_FLOPS // 4
# ... and for adding each expert's weight gradients once per source rank, for an answer that runs its experts on
# each source's chunk apart (autograd then accumulates (N-1) more gradients into each expert's two weights).
ACCUMULATION_ALLOWANCE = (N - 1) * LOCAL * 2 * DIM * H


# What of that room runs outside backward: the routing's forward (softmax, top-1, positions, the gate's multiply,
# the combine: about 4,000-5,300 FLOPs in the reference and the other styles), at most half the routing's room. The
# accumulation allowance is autograd's, inside backward. A dispatch or combine written as one-hot masks multiplied
# in and summed (n·K·d multiplies and as many adds: 26,624 FLOPs, forward alone) is products in elementwise ops and
# does not fit; as matmuls it is over the exact products.
ROUTING_FORWARD = ROUTING_ALLOWANCE // 2


def forward_room(rank: int) -> int:
    """The most elementwise work (FLOPs not in products) rank `rank` may compute outside backward: its experts'
    gelu on each kept token (h each) and the routing's forward."""
    return KEPT_ON[rank] * H + ROUTING_FORWARD


def elementwise_forward(obs: Observation, rank: int) -> int:
    return sum(e["flops"] - e.get("product_flops", 0) for e in obs.events_of(rank, "compute", "forward"))


def least_of(rank: int) -> int:
    """The products rank `rank` computes, exactly: the router's three matmuls, its experts' six per kept token."""
    return ROUTER_FLOPS + KEPT_ON[rank] * TOKEN_FLOPS


def compute_of(rank: int) -> int:
    """The most rank `rank` may compute: those products, gelu and its backward for each kept token, the routing's
    elementwise work and the accumulation of its experts' gradients per source rank."""
    return ROUTER_FLOPS + KEPT_ON[rank] * TOKEN_WORK + ROUTING_ALLOWANCE + ACCUMULATION_ALLOWANCE


def unreached(got, expected):
    """A weight that no token reached has no .grad (None) in an answer that skips an expert without tokens: that is
    a zero gradient, and right when the serial one is zero. Anything else is compared as it is."""
    if got is None and isinstance(expected, torch.Tensor) and not expected.any():
        return torch.zeros_like(expected)
    return got


def dropped_rows(counts) -> list[int]:
    """Per rank, the rows it would send if the tokens over capacity crossed the links too: its own dropped tokens
    out and the results of other ranks' dropped tokens back (in forward, as many again in backward, so x2 later)."""
    rows = [0] * N
    for s in range(N):
        for e in range(E):
            over = max(0, counts[s][e] - CAPACITY)
            d = e // LOCAL
            if over and d != s:
                rows[s] += over
                rows[d] += over
    return [2 * r for r in rows]


def bytes_of(rank: int) -> int:
    return 2 * (SENT_AWAY[rank] + RECEIVED[rank]) * ROW + BOOKKEEPING_BYTES


class ExpertParallel(PuzzleSpec):
    id, name, title = "p12", "expert_parallel", "Expert parallelism (mixture of experts)"
    entries = ("AllToAll", "moe_forward")
    world_size = N
    cost = CostModel(latency_ticks=0, bytes_per_tick=512)
    hints = ("Exchange the counts first (an all_to_all_single of one number per expert), then the tokens.",
             "An all-to-all's backward is the same all-to-all with the split sizes swapped.",
             "The router learns through the gate: y = x + p·expert(x).")

    def make_inputs(self, seed):
        return make_inputs(seed)

    def reference(self, inputs):
        return moe(inputs)

    def launch(self, inputs):
        per_rank = []
        for r in range(N):
            experts = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
                       for w1, w2 in inputs["experts"][r * LOCAL:(r + 1) * LOCAL]]
            per_rank.append((inputs["x"][r].detach().clone().requires_grad_(), inputs["target"][r],
                             inputs["router"].detach().clone().requires_grad_(), experts))
        return (FACTOR,), per_rank

    def program(self, module):
        moe_forward = module.moe_forward

        def run(dist, capacity_factor, x, target, router, experts):
            y = moe_forward(dist, x, router, experts, capacity_factor)
            if not isinstance(y, torch.Tensor) or y.shape != (N_TOKENS, DIM):
                what = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
                raise TypeError(f"moe_forward must return y, a tensor [{N_TOKENS}, {DIM}] (this rank's tokens); "
                                f"it returned {what}")
            if not y.requires_grad:
                raise RuntimeError("moe_forward returned a y that autograd cannot differentiate (y.requires_grad is "
                                   "False): was it computed under torch.no_grad(), or detached?")
            loss_fn(y, target).backward()
            return {"y": y.detach(), "x_grad": x.grad, "router_grad": router.grad,
                    "grads": [(w1.grad, w2.grad) for w1, w2 in experts]}

        return run

    def budgets(self, inputs):
        budgets = {"peak memory": Budget(
            "peak memory", "2·2·W_E + 2·d·E·8 + 4·n·d·8 + N·2·C·(3·d + 3·h)·8 + W_E (2 experts' weights and their "
            "gradients; the router and its gradient; x, target, x.grad, y; per token it may receive, at most "
            "N·2·C = 24, 3 rows of d and 3 of h; an expert's fresh weight gradients before autograd adds them up)",
            PEAK, "bytes")}
        for r in range(N):
            budgets[f"expert compute, rank {r}"] = Budget(
                "expert compute", f"6·n·d·E + K·(12·d·h + 2·h) + 12·d·h/4 + (N-1)·2·2·d·h, with K = {KEPT_ON[r]} "
                f"tokens kept for rank {r}'s experts (the router's matmuls, then its experts' forward and backward "
                f"with gelu's; room for the routing's elementwise work and for adding the experts' gradients once "
                f"per source rank; of it exactly 6·n·d·E + K·12·d·h = {least_of(r):,} in products, and at most "
                f"K·h + 12·d·h/8 = {forward_room(r):,} of elementwise work outside backward)", compute_of(r),
                "count")
            budgets[f"communication, rank {r}"] = Budget(
                "communication", f"2·(S + R)·d·8 + 1 KiB with S = {SENT_AWAY[r]} tokens leaving rank {r} and R = "
                f"{RECEIVED[r]} results it returns (forward and backward)", bytes_of(r), "bytes")
        return budgets

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        got = obs.results
        cause = {}

        def diagnose(key):
            def named(_bad):
                if key not in cause:
                    cause[key] = safe_diagnosis(self.diagnose_values, got, ref, inputs, key)
                return cause[key]
            return named

        budgets = self.budgets(inputs)
        return [
            values_check("output", self.pairs(got, ref, "y", "y"), "outputs", diagnose("y")),
            values_check("input gradient", self.pairs(got, ref, "x_grad", "x.grad"), "input gradients",
                         diagnose("x_grad")),
            values_check("router gradient", self.pairs(got, ref, "router_grad", "router.grad"), "router gradients",
                         diagnose("router_grad")),
            values_check("expert gradients", self.expert_pairs(got, ref), "expert gradients", diagnose("grads")),
            self.compute_check(obs, budgets),
            self.communication_check(obs, budgets, inputs),
            self.memory_check(obs, budgets["peak memory"]),
        ]

    @staticmethod
    def pairs(got, ref, key, label):
        return [(f"rank {r}: {label}", unreached(got[r].get(key) if isinstance(got[r], dict) else None, ref[r][key]),
                 ref[r][key], r) for r in range(N)]

    @staticmethod
    def expert_pairs(got, ref):
        pairs = []
        for r in range(N):
            for j in range(LOCAL):
                pair = pair_at(got[r].get("grads") if isinstance(got[r], dict) else None, j)
                for k, which in enumerate(("w1", "w2")):
                    expected = ref[r]["grads"][j][k]
                    pairs.append((f"rank {r}: experts[{j}].{which}.grad (expert {r * LOCAL + j})",
                                  unreached(pair[k], expected), expected, r))
        return pairs

    def compute_check(self, obs: Observation, budgets) -> Check:
        per_rank = [flops(obs, r) for r in range(N)]
        products = [product_flops(obs, r) for r in range(N)]
        forward = [elementwise_forward(obs, r) for r in range(N)]
        off = [r for r in range(N) if per_rank[r] > compute_of(r) or products[r] != least_of(r)
               or forward[r] > forward_room(r)]
        ticks = [obs.busy_ticks(r) for r in range(N)]
        shown = ", ".join(f"rank {r}: {per_rank[r]:,} (at most {compute_of(r):,}), {products[r]:,} in products "
                          f"(exactly {least_of(r):,})" for r in range(N))
        clock = (f"On the clock, compute per rank: {', '.join(f'{t:,}' for t in ticks)} ticks; the step took "
                 f"{fmt(obs.makespan, 'ticks')}" if obs.makespan else "")
        r = off[0] if off else 0
        budget = budgets[f"expert compute, rank {r}"]
        if not off:
            return Check("expert compute", True, f"every rank computed the router on its own tokens and its "
                         f"experts on the tokens it keeps: {shown} FLOPs. {clock}".rstrip(". ") + ".",
                         measured=per_rank[0], budget=budget)
        if products[r] != least_of(r):
            word = f"with {products[r]:,} in products where {least_of(r):,} are its share"
        elif per_rank[r] <= compute_of(r):
            message = (f"rank {r} computed {per_rank[r]:,} FLOPs, within {budget.describe()} FLOPs, and its products "
                       f"are its share exactly, but {forward[r]:,} of them are elementwise work and reductions "
                       f"outside backward, where its experts' gelus (K·h = {KEPT_ON[r] * H:,}) and the routing's "
                       f"forward (at most 12·d·h/8 = {ROUTING_FORWARD:,}) take at most {forward_room(r):,}. Per "
                       f"rank: {shown}. {clock}".rstrip(". ") + ".")
            return Check("expert compute", False, message, measured=per_rank[r], budget=budget,
                         diagnosis=self.diagnose_forward(r, forward[r]))
        else:
            word = "more than"
        message = (f"rank {r} computed {per_rank[r]:,} FLOPs, {word} the budget {budget.describe()} FLOPs "
                   f"allows. Per rank: {shown}. {clock}".rstrip(". ") + ".")
        if products[r] < least_of(r) and per_rank[r] - products[r] >= least_of(r) - products[r]:
            diagnosis = products_short(obs, r, least_of(r))
        elif products[r] == least_of(r):
            diagnosis = (f"rank {r}'s products are its share exactly, but it computed "
                         f"{per_rank[r] - compute_of(r) + ACCUMULATION_ALLOWANCE + ROUTING_ALLOWANCE:,} FLOPs of "
                         f"elementwise work and reductions beyond its experts' gelus: more than routing its tokens "
                         f"takes ({ROUTING_ALLOWANCE + ACCUMULATION_ALLOWANCE:,} allowed)")
        else:
            diagnosis = safe_diagnosis(self.diagnose_compute, r, products[r])
        return Check("expert compute", False, message, measured=per_rank[r], budget=budget, diagnosis=diagnosis)

    @staticmethod
    def diagnose_forward(rank: int, forward: int) -> str:
        """Forward elementwise work beyond the routing's: named when its excess is at least the size of a one-hot
        dispatch or combine of the rank's kept tokens (n·K·d multiplies and as many adds)."""
        excess = forward - forward_room(rank)
        dense = 2 * N_TOKENS * (N_TOKENS - DROPPED) * DIM
        size = (f" ({excess:,} FLOPs beyond the room; a one-hot dispatch or combine of its kept tokens, masks "
                f"multiplied into their rows and summed, is n·K·d multiplies and as many adds, {dense:,})"
                if 2 * excess >= dense else "")
        return (f"rank {rank} did products in elementwise ops outside backward{size}: a dispatch or combine written "
                f"as masks multiplied in and summed is a product all the same, and this puzzle's products are the "
                f"router's and the experts' only. Move rows with an index instead: x[kept] to send them, "
                f"torch.zeros_like(x).index_copy(0, kept, p * results) to put the results back")

    @staticmethod
    def diagnose_compute(rank: int, products: int) -> str:
        """Named from the number of token rows the experts ran on, read off the products (exact per token row)."""
        kept = KEPT_ON[rank]
        if products == least_of(rank) - 2 * ROUTER_FLOPS // 3:
            return (f"rank {rank} ran everything but the router's backward (its two matmuls, 4·n·d·E = "
                    f"{2 * ROUTER_FLOPS // 3:,} FLOPs): no gradient reached the router. It learns through the gate: "
                    f"y = x + p·expert(x), with p not detached")
        rows, rest = divmod(products - ROUTER_FLOPS, TOKEN_FLOPS)
        if rest or rows < 0:
            return ""
        if rows == N_TOKENS - DROPPED:
            return (f"rank {rank} ran its own {rows} kept tokens through their experts instead of the {kept} tokens "
                    f"routed to its own experts: the experts' work belongs on the experts' ranks (all-to-all the "
                    f"tokens there)")
        if rows == N * LOCAL * CAPACITY:
            return (f"rank {rank}'s experts ran on N·2·C = {rows} rows: every rank's share padded to the capacity "
                    f"C = {CAPACITY}. Send and compute only the tokens routed and kept")
        if rows > kept:
            return (f"rank {rank}'s experts ran on {rows} token rows, {rows - kept} more than the {kept} it keeps: "
                    f"dropped tokens, padding, or the same tokens twice?")
        return (f"rank {rank}'s experts ran on {rows} token rows, {kept - rows} fewer than the {kept} routed to them "
                f"and kept (see the values)")

    def communication_check(self, obs: Observation, budgets, inputs) -> Check:
        by_rank = [sent(obs, r) for r in range(N)]
        totals = [sum(b for _, b in k.values()) for k in by_rank]
        over = [r for r in range(N) if totals[r] > bytes_of(r)]
        r = over[0] if over else 0
        budget = budgets[f"communication, rank {r}"]
        shown = ", ".join(f"rank {q}: {totals[q]:,} (budget {bytes_of(q):,})" for q in range(N))
        message = (f"rank {r} sent {fmt(totals[r], 'bytes')} ({describe_sent(by_rank[r])}), "
                   f"{'within' if not over else 'over'} the budget {budget.describe()}. Per rank: {shown}")
        return Check("communication", not over, message, measured=totals[r], budget=budget,
                     diagnosis=safe_diagnosis(self.diagnose_sent, r, by_rank[r], totals, inputs,
                                              [product_flops(obs, q) for q in range(N)]) if over else "")

    @staticmethod
    def diagnose_sent(rank: int, by_kind, totals, inputs, computed) -> str:
        """`computed`: each rank's FLOPs in products (the router's and its experts' matmuls)."""
        if any(k.startswith(("all_gather", "broadcast")) for k in by_kind):
            return ("tokens or weights were gathered onto every rank: expert parallelism sends each token only to "
                    "its expert's rank, with all_to_all_single in uneven splits, and the results back")
        extra = [totals[r] - bytes_of(r) + BOOKKEEPING_BYTES for r in range(N)]  # counts within the 1 KiB
        padded = [2 * 2 * (N - 1) * LOCAL * CAPACITY * ROW for _ in range(N)]  # C rows for every other expert
        if all(sized_like(t, {"padded": p}) for t, p in zip(totals, padded)):
            return (f"every rank sent C = {CAPACITY} rows for every expert of every other rank, there and back: "
                    f"buffers padded to the capacity. Send the counts first, then only the tokens kept")
        dropped = dropped_rows(inputs["counts"])
        if any(dropped) and all(sized_like(x, {"dropped": d * ROW}) for x, d in zip(extra, dropped)):
            # whether they were then dropped or computed where they arrived, the experts' products say
            there = ("sent and dropped where they arrived" if computed == [least_of(q) for q in range(N)] else
                     "sent and computed where they arrived (see expert compute): the capacity was applied nowhere"
                     if all(c > least_of(q) for q, c in enumerate(computed)) else "sent")
            return ("every rank's excess is exactly the tokens over capacity: the ones it routed to other ranks' "
                    "experts, sent, and the results of the ones other ranks routed to its experts, sent back, in "
                    f"forward and backward: tokens over capacity were {there}. Drop them where they are "
                    f"({DROPPED} per rank here): a dropped token never leaves its rank")
        beyond = extra[rank]  # the counts included
        return (f"rank {rank} sent {beyond:,} bytes ({beyond / ROW:.1f} token rows) beyond the tokens that leave it and "
                f"the results it returns") if beyond > 0 else ""

    def memory_check(self, obs: Observation, budget: Budget) -> Check:
        over = [(r, p) for r, p in enumerate(obs.peak_bytes) if p > budget.value]
        if not over:
            worst = max(obs.peak_bytes)
            return Check("peak memory", True, f"largest peak {fmt(worst, 'bytes')}, within the budget "
                                              f"{budget.describe()}", measured=worst, budget=budget)
        r, peak = max(over, key=lambda x: x[1])
        top = obs.ledgers[r].get("peak_by_line", [])[:2]
        lines = "; ".join(f"{e['site']} ({fmt(e['bytes'], 'bytes')})" for e in top)
        diagnosis = ""
        if peak - budget.value >= (E - LOCAL) * W_E // 2 and any(
                e["kind"].startswith("all_gather") for e in obs.events_of(r, "comm")):
            diagnosis = (f"rank {r} gathered other ranks' experts (all {E} experts are {fmt(E * W_E, 'bytes')}; its "
                         f"own {LOCAL}, {fmt(LOCAL * W_E, 'bytes')}): expert parallelism moves the tokens to the "
                         f"experts, not the experts to the tokens")
        return Check("peak memory", False, f"rank {r} peaked at {fmt(peak, 'bytes')}, over the budget "
                                           f"{budget.describe()}. Largest at the peak: {lines}",
                     measured=peak, budget=budget, diagnosis=diagnosis)

    # ---- what wrong values say

    def diagnose_values(self, got, ref, inputs, key) -> str:
        if key != "y" and not all(self.same(g, ref[r], "y") for r, g in enumerate(got)):
            return "the output is already wrong (see the output check): fix the forward first"
        for variant, text in VARIANTS.items():
            replay = moe(inputs, variant)
            if all(self.same(g, replay[r], k) for r, g in enumerate(got) for k in ("y", "x_grad", "router_grad")):
                return text
        if key == "y":
            perm = [self.permuted_rows(g, ref[r]) for r, g in enumerate(got)]
            if any(perm) and all(p is not False for p in perm):
                return ("every rank's output rows are the right rows in the wrong order: the results came back in the "
                        "order the tokens were sent (sorted by expert), not put back in token order. Put each result "
                        "in its own token's row (index_copy with the kept tokens' indices)")
        return ""

    @staticmethod
    def same(got, expected, key) -> bool:
        """got[key] equals expected[key]; a gradient that never arrived (None) counts as zeros on either side."""
        value = got.get(key) if isinstance(got, dict) else None
        want = expected[key]
        if want is None and value is None:
            return True
        if want is None:
            want = torch.zeros_like(value) if isinstance(value, torch.Tensor) else None
            return want is not None and tensor_mismatch(value, want) is None
        if value is None:
            return bool((want == 0).all())
        return tensor_mismatch(value, want) is None

    @staticmethod
    def permuted_rows(got, expected):
        """True when y's rows are a non-trivial permutation of the expected rows, None when y is right, else
        False."""
        y = got.get("y") if isinstance(got, dict) else None
        if tensor_mismatch(y, expected["y"]) is None:
            return None
        if not isinstance(y, torch.Tensor) or y.shape != expected["y"].shape:
            return False
        used = set()
        for row in y:
            match = next((i for i, e in enumerate(expected["y"]) if i not in used and tensor_mismatch(row, e) is None),
                         None)
            if match is None:
                return False
            used.add(match)
        return True


SPEC = ExpertParallel()
