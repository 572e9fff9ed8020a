"""p15 context parallelism: causal attention over a long sequence on 4 ranks, ring attention with the online
softmax, the sequence split so that the causal mask leaves every rank the same work (chunks i and 2N-1-i).

The rules, each measured as such: the output and every gradient (the input's, the projections' and through them
the queries', keys' and values') against the serial causal attention, at the positions the answer's own split
gives each rank; the received K/V blocks held at each message (received_blocks.py) and the peak memory (O(S/N):
never the full score matrix); each rank's compute (the 2N+1 tiles the mask leaves it, not the ones it empties),
and how far the ranks' compute is apart (the balance); the bytes each rank sends in forward and in backward, and to
whom (round the ring: each block to a ring neighbour); and
the communication left exposed on the clock (the messages hidden behind the tiles). The split is the answer's:
load_balanced_chunks is called by the harness on every rank, which makes the rank's own two chunks of the input."""

from __future__ import annotations

import torch

from puzzles.model import loss_fn

from ...core.compare import safe_diagnosis, values_check
from ...core.probe import memory_now
from ...core.result import Budget
from ...core.rules import BOOKKEEPING_BYTES, COMPUTE_CAP, exposed_communication, overlap_check
from ...core.spec import Observation, PuzzleSpec
from . import checks as rules
from . import memory
from .costs import LEAST, MOST, block_transfer_ticks, share
from .received_blocks import watched
from .serial import (CHUNK, CHUNKS, COST, D, HEADS, KV, LSE, TILE, TOKENS, B, N, Q, W, chunk_inputs, expected_on,
                     make_inputs, serial)

BALANCE_PERCENT = 5
MARGIN_PERCENT = 2
PEAK = 2 * W + 24 * Q + 16 * TILE + BOOKKEEPING_BYTES
KEPT = 8 * Q + BOOKKEEPING_BYTES


def checked_split(chunks_of, world: int) -> list[tuple[int, int]]:
    """Every rank's chunks by the answer's load_balanced_chunks, which must give each of the 2N chunks to exactly
    one rank, two each: else a ValueError that says how it does not."""
    split = []
    for rank in range(world):
        pair = chunks_of(rank, world)
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and
                all(isinstance(c, int) and not isinstance(c, bool) for c in pair)):
            raise TypeError(f"load_balanced_chunks({rank}, {world}) must return two chunk numbers (ints), "
                            f"the chunks of the sequence rank {rank} holds; it returned {pair!r}")
        split.append(tuple(pair))
    held = sorted(c for pair in split for c in pair)
    if held != list(range(2 * world)):
        missing = sorted(set(range(2 * world)) - set(held))
        twice = sorted({c for c in held if held.count(c) > 1})
        raise ValueError(f"load_balanced_chunks must give each of the 2N = {2 * world} chunks (0..{2 * world - 1}) "
                         f"to exactly one rank, two per rank; it gives {', '.join(f'rank {r} {p}' for r, p in enumerate(split))}"
                         f"{f': no rank holds chunk(s) {missing}' if missing else ''}"
                         f"{f'; chunk(s) {twice} on more than one rank' if twice else ''}")
    return split


class RingAttention(PuzzleSpec):
    id, name, title = "p15", "ring_attention", "Context parallelism (ring attention)"
    entries = ("load_balanced_chunks", "merge", "RingAttention", "context_parallel_attention")
    world_size = N
    cost = COST
    simulator_only = ("makespan",)
    hints = ("Post the isend of the block you hold and the irecv of the next before computing with yours; wait "
             "only after the block's tiles.",
             "A tile whose key chunk comes after the query chunk is empty: skip it. Query chunk i against key "
             "chunk i is the diagonal: masked.",
             "In backward keep your own block's gradient at home; the one that travels starts at the next rank and "
             "comes home after N-1 hops.")

    def make_inputs(self, seed):
        return make_inputs(seed)

    def reference(self, inputs):
        return serial(inputs)

    def launch(self, inputs):
        weights = [(inputs["wqkv"].detach().clone().requires_grad_(), inputs["wo"].detach().clone().requires_grad_())
                   for _ in range(N)]
        return (inputs["seed"],), weights

    def program(self, module):
        chunks_of, attention = module.load_balanced_chunks, module.context_parallel_attention

        def run(dist, seed, wqkv, wo):
            split = checked_split(chunks_of, dist.get_world_size())
            mine = split[dist.get_rank()]
            pieces = [chunk_inputs(seed, c) for c in mine]  # this rank's own two chunks, made here
            x = torch.cat([p[0] for p in pieces], dim=1).requires_grad_()
            target = torch.cat([p[1] for p in pieces], dim=1)
            del pieces
            watch, records = watched(dist)
            before = memory_now()
            y = attention(watch, x, wqkv, wo, HEADS)
            kept = memory_now() - before  # what the forward keeps for backward, y included
            if not isinstance(y, torch.Tensor) or y.shape != (B, TOKENS, D):
                what = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
                raise TypeError(f"context_parallel_attention must return y, a tensor [{B}, {TOKENS}, {D}] (this "
                                f"rank's tokens); it returned {what}")
            if not y.requires_grad:
                raise RuntimeError("context_parallel_attention returned a y that autograd cannot differentiate "
                                   "(y.requires_grad is False): was it computed under torch.no_grad(), or detached?")
            loss_fn(y.reshape(-1, D), target.reshape(-1, D)).backward()
            return {"chunks": mine, "y": y.detach(), "x_grad": x.grad, "wqkv_grad": wqkv.grad, "wo_grad": wo.grad,
                    "held": records.held, "kept": kept}

        return run

    def budgets(self, inputs):
        c, t = share().ticks, block_transfer_ticks()
        margin = c * MARGIN_PERCENT // 100
        return {
            "K/V blocks": Budget("K/V blocks", "2 K/V blocks of other ranks' data alive at any message outside "
                                 f"backward, 2·KV + 1 KiB (KV = 2·b·(S/N)·d·8 = {KV:,})",
                                 2 * KV + BOOKKEEPING_BYTES, "bytes"),
            "K/V blocks in backward": Budget("K/V blocks in backward", "2 K/V blocks and 2 dK/dV blocks received "
                                             "alive at any message in backward, 4·KV + 1 KiB",
                                             4 * KV + BOOKKEEPING_BYTES, "bytes"),
            "peak memory": Budget("peak memory", f"2·W + 24·Q + 16·T + 1 KiB (the weights and their gradients, W = "
                                  f"{W:,}; at most 24 tensors of one rank's [b, S/N, d], Q = {Q:,}: inputs, what "
                                  f"backward keeps, the K/V and dK/dV blocks in flight; one step's scores, a whole "
                                  f"block's 4 tiles [b, h, c, c] of T = {TILE:,} with their softmax and 2 gradients: "
                                  f"never the [b, h, S/N, S] scores of every key)", PEAK, "bytes"),
            "forward memory": Budget("forward memory", "8·Q + 1 KiB held after the forward beyond what the rank "
                                     "held before it (what backward needs: q, k, v, out and lse, the heads merged "
                                     "for wo, y; no score, no other rank's block)", KEPT, "bytes"),
            "compute": Budget("compute", "24·b·(S/N)·d² + (2N+2)·(7·2·b·c²·d + 16·b·h·c²) + 16·N·b·(S/N)·d (the "
                              "projections; at most 2N+2 tiles, each with 2 products forward, 4 backward and 1 "
                              "recomputed, and 16 FLOPs per score; merges and accumulations; at least "
                              f"24·b·(S/N)·d² + (2N+1)·6·2·b·c²·d = {LEAST:,} in products)", MOST, "count"),
            "balance": Budget("balance", f"the busiest rank's FLOPs at most {BALANCE_PERCENT}% above the least "
                                         f"busy's", BALANCE_PERCENT / 100, "fraction"),
            "forward communication": Budget("forward communication", "exactly (N-1) K/V blocks, (N-1)·KV (+ 1 KiB), "
                                            "each sent to a ring neighbour",
                                            (N - 1) * KV + BOOKKEEPING_BYTES, "bytes"),
            "backward communication": Budget("backward communication", "exactly (N-1) K/V blocks and (N-1) dK/dV "
                                             "blocks, 2·(N-1)·KV (+ 1 KiB), the K/V blocks to a ring neighbour",
                                             2 * (N - 1) * KV + BOOKKEEPING_BYTES, "bytes"),
            "makespan": Budget("makespan", f"communication left exposed, makespan - min(work, 1.25·C), at most "
                               f"one block's transfer {t:,} + margin {MARGIN_PERCENT}%·C {margin:,} ticks "
                               f"(C = {c:,}, a rank's compute)", t + margin, "ticks"),
        }

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        got = obs.results
        budgets = self.budgets(inputs)
        expected = [expected_on(ref, inputs, self.chunks_of(g)) for g in got]
        cause = {}

        def diagnose(key):
            def named(_bad):
                if key not in cause:
                    cause[key] = safe_diagnosis(rules.diagnose_values, got, expected, inputs, key)
                return cause[key]
            return named

        qkv = values_check("q/k/v gradients", self.qkv_pairs(got, expected), "gradients of the q, k and v "
                           "projections", diagnose("wqkv_grad"))
        return [
            values_check("output", self.pairs(got, expected, "y", "y"), "outputs", diagnose("y")),
            values_check("input gradient", self.pairs(got, expected, "x_grad", "x.grad"), "input gradients",
                         diagnose("x_grad")),
            qkv,
            values_check("output projection gradient", self.pairs(got, expected, "wo_grad", "wo.grad"),
                         "output projection gradients", diagnose("wo_grad")),
            memory.blocks_check(obs, budgets["K/V blocks"], budgets["K/V blocks in backward"]),
            memory.memory_check(obs, budgets["peak memory"]),
            memory.kept_check(obs, budgets["forward memory"]),
            rules.compute_check(obs, budgets["compute"], LEAST),
            rules.balance_check(obs, budgets["balance"]),
            *(rules.phase_communication_check(obs, budgets[f"{phase} communication"], phase, qkv.passed)
              for phase in ("forward", "backward")),
            overlap_check(obs, budgets["makespan"], share().ticks, COST.device, self.diagnose_makespan),
        ]

    @staticmethod
    def chunks_of(result) -> tuple:
        return tuple(result.get("chunks", ())) if isinstance(result, dict) else ()

    @staticmethod
    def pairs(got, expected, key, label):
        return [(f"rank {r}: {label}", got[r].get(key) if isinstance(got[r], dict) else None, expected[r][key], r)
                for r in range(N)]

    @staticmethod
    def qkv_pairs(got, expected):
        """wqkv.grad in three column blocks: x_rᵀ·dQ_r, x_rᵀ·dK_r, x_rᵀ·dV_r, so a wrong dK says 'keys'."""
        pairs = []
        for r in range(N):
            g = got[r].get("wqkv_grad") if isinstance(got[r], dict) else None
            for i, what in enumerate(("queries", "keys", "values")):
                cols = slice(i * D, (i + 1) * D)
                part = g[:, cols] if isinstance(g, torch.Tensor) and g.shape == (D, 3 * D) else g
                pairs.append((f"rank {r}: wqkv.grad[:, {i * D}:{(i + 1) * D}] ({what}: x·d{what[0].upper()})", part,
                              expected[r]["wqkv_grad"][:, cols], (r, what)))
        return pairs

    @staticmethod
    def diagnose_makespan(obs: Observation) -> str:
        c = share().ticks
        unequal = rules.unbalanced_split(rules.split_of(obs))
        if unequal:
            return unequal
        compute = exposed_communication(obs, c)[0]
        if compute > c * COMPUTE_CAP[0] // COMPUTE_CAP[1]:
            return (f"a rank's compute alone took {compute:,} ticks, {compute / c:.2f}x C = {c:,} (see compute): "
                    f"compute beyond 1.25·C hides no communication")
        return rules.idle_while_messages(obs)


SPEC = RingAttention()
