"""p14 sequence parallelism: Megatron's tensor parallelism on the transformer block, with the norms and the
residual stream on 1/N of the sequence (an all-gather before each column-parallel region, a reduce-scatter after
each row-parallel one).

The rules, each measured as such: output, input gradient, every weight's gradient (the norms' included) against
the serial blocks; what the forward leaves alive (the activation memory, read between the learner's forward and
the grader's backward); each rank's compute (1/N of the serial blocks' work); and the bytes each rank sends in
forward and in backward (what tensor parallelism's all-reduces move, and the norms' gradients). Wrong values are
named by replaying the common mistakes (mistakes.py)."""

from __future__ import annotations

import torch

from puzzles.model import TransformerWeights, init_transformer, make_sequences

from ...core.compare import safe_diagnosis, values_check
from ...core.probe import memory_now
from ...core.result import Budget, Check, fmt
from ...core.rules import communication_check, compute_check
from ...core.spec import Observation, PuzzleSpec
from .costs import (ACTIVATIONS, ALLOWANCE, BACKWARD_BYTES, COST, FORWARD_BYTES, NORM_GRAD_BYTES, PRODUCT_FLOPS,
                    RANK_BACKWARD, RANK_BLOCK_FORWARD, RANK_WORK, REPEATED_NORM_WORK, REPEATED_TOKEN_WORK, SERIAL_FLOPS,
                    SHARE, SP_BLOCK, TP_ACTIVATIONS, TP_BLOCK, TP_BYTES)
from .layout import (B, D, E, H, HEADS, L, MATRICES, N, NORMS, S, SN, grads_of, rank_slice, sequence_loss, serial,
                     shard_layers, tokens)
from .mistakes import (BACKWARD_MISTAKES, FORWARD_MISTAKES, Replays, close, diagnose_norms, matches, matches_matrices)

SHARD = E // N  # one [b, s/N, d] activation
NAMED = 2 * L * B * SN * D  # how near a compute excess must be to a named one's size (they are 24,576 apart)
WRONG_FORWARD = ("the output is wrong too (see the output check): this figure is another computation's, so its size "
                 "names nothing; fix the values first")


class SequenceParallel(PuzzleSpec):
    id, name, title = "p14", "sequence_parallel", "Sequence parallel (TP + SP)"
    entries = ("GatherFromSequenceParallel", "ReduceScatterToSequenceParallel", "sp_forward")
    world_size = N
    cost = COST
    hints = ("All-gather the norm's output along the sequence before the heads and before w1; reduce-scatter "
             "the partial outputs after wo and after w2; each one's backward is the other collective.",
             "The norms' weights see only this rank's tokens: all-reduce their gradients in backward.")

    def make_inputs(self, seed):
        x, target = make_sequences(B, S, D, seed)
        return {"layers": init_transformer(L, D, H, seed + 1), "x": x, "target": target}

    def reference(self, inputs):
        full = serial(inputs["x"], inputs["target"], inputs["layers"])
        return {"full": full, "ranks": [rank_slice(full, r) for r in range(N)]}

    def launch(self, inputs):
        per_rank = []
        for r in range(N):
            x = inputs["x"][:, tokens(r)].clone().requires_grad_()
            layers = [TransformerWeights(*(t.requires_grad_() for t in w)) for w in shard_layers(inputs["layers"], r)]
            per_rank.append((x, inputs["target"][:, tokens(r)].clone(), layers))
        return (), per_rank

    def program(self, module):
        sp_forward = module.sp_forward

        def run(dist, x, target, layers):
            before = memory_now()
            y = sp_forward(dist, x, layers, HEADS)
            held = memory_now() - before
            if not isinstance(y, torch.Tensor):
                raise TypeError(f"sp_forward must return y, this rank's tokens of the output, a tensor [{B}, {SN}, "
                                f"{D}]; it returned {type(y).__name__}")
            if y.shape != (B, SN, D):
                raise TypeError(f"sp_forward must return y of shape [{B}, {SN}, {D}], this rank's {SN} tokens of "
                                f"each sequence; it returned shape {list(y.shape)}")
            if not y.requires_grad:
                raise RuntimeError("sp_forward returned a y that autograd cannot differentiate (y.requires_grad is "
                                   "False): was it computed under torch.no_grad(), or detached?")
            (sequence_loss(y, target) / N).backward()  # the ranks' losses add up to the serial loss
            return {"y": y.detach(), "x_grad": x.grad, "held": held,
                    "grads": [grads_of(w) for w in layers]}

        return run

    def budgets(self, inputs):
        return {
            "activation memory": Budget(
                "activation memory", "L·(2·E + 8·E/N + 2·b·s·(h/N)·8 + b·(a/N)·s²·8 + 2·b·(s/N)·8 + s²) + E/N "
                "+ 1 KiB bytes, E = b·s·d·8 (per block the two gathered norm outputs [b, s, d]; on 1/N of the "
                "sequence the norms' inputs and normalised values, q k v of the rank's heads, their output, the "
                "residual and the block's output; x@w1_r and its gelu; the rank's attention weights; the norms' "
                "1/rms; the mask; E/N for a copy of the input shard, in another layout say)", ACTIVATIONS, "bytes"),
            "compute": Budget("compute", f"W/N + 1 + 4·L·b·s·d, W = {SERIAL_FLOPS:,} the serial blocks' work "
                              "(their products, norms, attention, gelu and residual adds, forward and backward, and "
                              "the loss's backward, each split N ways; + 1 the backward of the grader's loss / N; "
                              "4·L·b·s·d for bookkeeping, room for the additions of collectives written with send "
                              "and recv)", SHARE, "count"),
            "forward communication": Budget(
                "forward communication", "L·2·2(N-1)/N·E + 1 KiB bytes (per block two all-gathers and two "
                "reduce-scatters of [b, s, d]: what tensor parallelism's two all-reduces move)", FORWARD_BYTES,
                "bytes"),
            "backward communication": Budget(
                "backward communication", "L·2·2(N-1)/N·E + L·2·2(N-1)/N·d·8 + 1 KiB bytes (the same, in "
                "reverse, and an all-reduce of the two norms' weight gradients per block)", BACKWARD_BYTES, "bytes"),
        }

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        got, want = obs.results, ref["ranks"]
        replays = Replays(inputs)
        checks = [
            values_check("output", [(f"rank {r}: y (tokens {r * SN}-{(r + 1) * SN - 1})", got[r].get("y"),
                                     want[r]["y"], r) for r in range(N)], "outputs",
                         lambda bad: self.diagnose_output(got, replays)),
            values_check("input gradient", [(f"rank {r}: x.grad", got[r].get("x_grad"), want[r]["x_grad"], r)
                                            for r in range(N)], "input gradients",
                         lambda bad: self.diagnose_grads(got, want, replays, "x_grad")),
            values_check("weight gradients", self.grad_pairs(got, want, MATRICES), "weight gradients",
                         lambda bad: self.diagnose_grads(got, want, replays, "grads")),
            values_check("norm gradients", self.grad_pairs(got, want, NORMS), "norm weight gradients",
                         lambda bad: self.diagnose_grads(got, want, replays, "norms")),
        ]
        budgets = self.budgets(inputs)
        # a memory or compute figure names a mistake by its size only when the forward computed the right thing
        forward_right = all(close(g.get("y"), w["y"]) for g, w in zip(got, want))
        checks.append(self.activation_check(obs, budgets["activation memory"], forward_right))
        checks.append(compute_check(obs, budgets["compute"], lambda r, fwd, bwd: self.diagnose_compute(
            r, fwd, bwd) if forward_right else WRONG_FORWARD, least=PRODUCT_FLOPS))
        for phase in ("forward", "backward"):
            checks.append(communication_check(obs, budgets[f"{phase} communication"], f"{phase} communication", phase,
                                              lambda r, by_kind, phase=phase: self.diagnose_sent(phase, by_kind)))
        return checks

    @staticmethod
    def grad_pairs(got, want, names):
        pairs = []
        for r in range(N):
            blocks = got[r].get("grads")
            for i in range(L):
                mine = blocks[i] if isinstance(blocks, (list, tuple)) and i < len(blocks) else None
                for name in names:
                    g = mine.get(name) if isinstance(mine, dict) else None
                    what = "whole" if name in NORMS else "rank's piece"
                    pairs.append((f"rank {r}: layers[{i}].{name}.grad ({what})", g, want[r]["grads"][i][name],
                                  (r, i, name)))
        return pairs

    @staticmethod
    def diagnose_output(got, replays) -> str:
        return replays.matching(got, FORWARD_MISTAKES, ["y"])

    @staticmethod
    def diagnose_grads(got, want, replays, which) -> str:
        if not all(close(g.get("y"), w["y"]) for g, w in zip(got, want)):
            return "the output is already wrong (see the output check): fix the forward first"
        if which == "norms" and all(matches(g, w, ["x_grad"]) and matches_matrices(g, w) for g, w in zip(got, want)):
            text = diagnose_norms(got, want)
            if text:
                return text
        text = replays.matching(got, BACKWARD_MISTAKES, ["x_grad", "grads"])
        if text:
            return text
        if which == "x_grad" and all(g.get("x_grad") is None for g in got):
            return ("x.grad is None on every rank: the graph that sp_forward built does not reach x (was x "
                    "detached, or replaced, before the first block?)")
        return ""

    # ---- activation memory

    @staticmethod
    def activation_check(obs: Observation, budget: Budget, forward_right: bool = True) -> Check:
        held = [res.get("held", 0) if isinstance(res, dict) else 0 for res in obs.results]
        r = max(range(N), key=held.__getitem__)
        ok = held[r] <= budget.value
        saving = f"{held[r] / TP_ACTIVATIONS:.0%} of plain tensor parallelism's {TP_ACTIVATIONS:,}"
        message = (f"rank {r}'s forward left {fmt(held[r], 'bytes')} alive for backward (its output included), "
                   f"{saving}; {'within' if ok else 'over'} the budget {budget.describe()}. Per rank: "
                   f"{', '.join(f'{h:,}' for h in held)} bytes")
        diagnosis = "" if ok else (safe_diagnosis(SequenceParallel.diagnose_held, held[r]) if forward_right
                                   else WRONG_FORWARD)
        return Check("activation memory", ok, message, measured=held[r], budget=budget, diagnosis=diagnosis)

    @staticmethod
    def diagnose_held(held: int) -> str:
        excess = held - L * SP_BLOCK
        if held > TP_ACTIVATIONS + L * SHARD:  # more than any tensor-parallel split keeps: no single mistake fits
            return ""
        if held >= TP_ACTIVATIONS - L * SHARD:
            return (f"as much as plain tensor parallelism holds ({TP_ACTIVATIONS:,} bytes, L·{TP_BLOCK:,}): the norms' "
                    f"inputs (the residual stream) and their normalised values were kept for the whole sequence. Run "
                    f"the norms and the residual adds on this rank's s/N tokens, and gather only the norm's output, "
                    f"right before the heads and before w1")
        shards = excess / SHARD
        return (f"{excess:,} bytes more than the formula, {shards:.1f} activations of [b, s/N, d] ({SHARD:,} bytes) "
                f"or {excess / E:.2f} of [b, s, d]: a tensor kept that backward does not need (a gather's or "
                f"reduce-scatter's input saved on ctx, a gathered buffer kept, or a view that keeps a whole [b, s, d] "
                f"alive)")

    # ---- compute and communication

    @staticmethod
    def diagnose_compute(rank, fwd, bwd) -> str:
        excess = fwd + bwd - RANK_WORK
        if abs(excess - REPEATED_TOKEN_WORK) <= NAMED:
            return (f"{excess:,} FLOPs beyond the share: exactly the norms' and the residual adds' work, forward and "
                    f"backward, on the other ranks' {S - SN} tokens of each sequence ((N-1)/N·L·(34·T·d + 10·T) = "
                    f"{REPEATED_TOKEN_WORK:,}): every rank ran them on the whole sequence, as plain tensor "
                    f"parallelism does. Run them on this rank's s/N tokens")
        if abs(excess - REPEATED_NORM_WORK) <= NAMED:
            return (f"{excess:,} FLOPs beyond the share: exactly the norms' work, forward and backward, on the other "
                    f"ranks' {S - SN} tokens of each sequence ((N-1)/N·L·(30·T·d + 10·T) = {REPEATED_NORM_WORK:,}): "
                    f"the norms ran on the whole sequence on every rank (the block's input gathered, not the norm's "
                    f"output?). Run each norm on this rank's s/N tokens, then gather its output")
        again = bwd - RANK_BACKWARD
        if excess > ALLOWANCE and again >= excess - ALLOWANCE:
            return (f"{excess:,} FLOPs beyond the share, all of them inside backward ({again / RANK_BLOCK_FORWARD:.2f} "
                    f"of a block's forward on this rank, {RANK_BLOCK_FORWARD:,} FLOPs): forward work run again in "
                    f"backward (recomputation: torch.utils.checkpoint, or a Function that recomputes). It trades "
                    f"compute for memory; this puzzle keeps what backward needs (the activation budget has room for "
                    f"it) and computes each forward once")
        return (f"rank {rank} computed {(fwd + bwd) / (SERIAL_FLOPS / N):.3f}x its share, the serial blocks' work / "
                f"N: {excess:,} FLOPs more")

    @staticmethod
    def diagnose_sent(phase, by_kind) -> str:
        reduced = all_reduced = by_kind.get("all_reduce", (0, 0))[1]
        if phase == "backward":
            reduced -= min(reduced, NORM_GRAD_BYTES)  # the norms' gradients: all-reduced by right
        gathers = sum(c for k, (c, _) in by_kind.items() if k.startswith("all_gather"))
        if phase == "backward" and reduced and reduced % NORM_GRAD_BYTES == 0 and reduced <= 4 * NORM_GRAD_BYTES:
            return (f"the norms' weight gradients all-reduced {reduced // NORM_GRAD_BYTES + 1} times "
                    f"({all_reduced:,} bytes of all-reduces, {NORM_GRAD_BYTES:,} each time): once is the sum")
        if reduced >= TP_BYTES - NORM_GRAD_BYTES - 1024 and gathers < 2 * L:
            return (f"plain tensor parallelism's all-reduces of the whole sequence ({all_reduced:,} bytes), and "
                    f"the sequence gathered besides: sequence parallelism replaces each all-reduce by a "
                    f"reduce-scatter after the row-parallel product and an all-gather before the next "
                    f"column-parallel one, {TP_BYTES:,} bytes in all, with nothing else to gather")
        if reduced > 1024:
            return ("an all-reduce of activations: the partial outputs (or the gathered input's gradients) summed "
                    "in full by all_reduce, then cut to this rank's tokens. A reduce-scatter gives each rank its "
                    "tokens of the sum for half the bytes")
        if phase == "backward" and gathers > 2 * L:
            return (f"{gathers} all-gathers in backward for {L} blocks, whose reduce-scatters need {2 * L}: the "
                    f"norm's output was gathered again in backward (its shard saved instead of the gathered "
                    f"input). That trades bytes for memory; this puzzle keeps the gathered input and moves what "
                    f"tensor parallelism's all-reduces move")
        return ""


SPEC = SequenceParallel()
