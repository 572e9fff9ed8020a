"""p4 tensor parallel: the Megatron MLP, column-parallel w1 and row-parallel w2, joined by the conjugate
operators f (identity forward, all-reduce backward) and g (all-reduce forward, identity backward).

The rules, each measured as such: output, input gradient and shard gradients against the serial model; each
rank's compute (1/N of the serial MLP's FLOPs: it works with its shards, never the full weights); the bytes each
rank sends in forward and in backward (at most one all-reduce of a [B, d] activation per block each way, whatever
collectives carry them); and the peak memory (weights 1/N). Wrong values are named by replaying the common
mistakes (mistakes.py)."""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ...core.compare import values_check
from ...core.result import Budget, Check, fmt
from ...core.rules import communication_check, compute_check, sent
from ...core.spec import Observation, PuzzleSpec, pair_at
from ..common.costs import block_costs, loss_costs
from .mistakes import (BACKWARD_MISTAKES, FORWARD_MISTAKES, MODEL_TOL, B, D, H, HS, L, Models, N, matches, shard)

F64 = 8
W = 2 * L * D * H * F64  # bytes of all the weights
ACTIVATION_ALL_REDUCE = 2 * (N - 1) * B * D * F64 // N  # what a rank sends in an all-reduce of a [B, d] activation
COST = CostModel()
PRODUCT_FLOPS = 12 * B * D * H * L // N  # per block 2 forward and 4 backward matmuls of 2·B·d·h, split N ways
# One rank's work, every op counted (common/costs.py): each block with its h/N columns is the plain block with h/N hidden
# units (2 matmuls, gelu on [B, h/N], the residual add on the whole [B, d], which every rank does); its backward (4
# matmuls, gelu's backward, the two gradients of its input added); and the loss's backward, which every rank runs.
_BLOCK = block_costs(B, D, HS, COST)
WORK = L * (_BLOCK[0] + _BLOCK[1]) + loss_costs(B, D, COST)[1]
ALLOWANCE = L * B * D  # room for bookkeeping: one elementwise op on every block's [B, d] activation
SHARE_FLOPS = WORK.flops + ALLOWANCE

GATHERED = ("the weights were gathered onto every rank (see forward communication): computed with full weights, f's "
            "and g's sums no longer add up the pieces they are for, and the values follow from that, not from f or "
            "g. Keep w1_r and w2_r split: each rank multiplies its own shards, and only the [B, d] activations move")


def weights_gathered(obs: Observation) -> bool:
    """Some rank gathered at least half of the other ranks' weight shards (all-gathers and broadcasts, in either
    phase): the replays of f's and g's mistakes, which compute with the shards, do not apply."""
    return any(sum(b for kind, (_, b) in sent(obs, r).items() if kind.startswith(("all_gather", "broadcast")))
               >= (N - 1) * W // N // 2 for r in range(N))


class TensorParallel(PuzzleSpec):
    id, name, title = "p4", "tensor_parallel", "Tensor parallel"
    entries = ("CopyToTensorParallel", "ReduceFromTensorParallel", "tp_forward")
    world_size = N
    cost = COST
    hints = ("f: identity forward, all-reduce backward; g: all-reduce forward, identity backward.",)

    def make_inputs(self, seed):
        x, target = make_batch(B, D, seed)
        return {"layers": init_layers(L, D, H, seed + 1), "x": x, "target": target}

    def reference(self, inputs):
        layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
                  for w1, w2 in inputs["layers"]]
        x = inputs["x"].detach().clone().requires_grad_()
        y = forward(x, layers)
        loss_fn(y, inputs["target"]).backward()
        full = [(w1.grad, w2.grad) for w1, w2 in layers]
        return {"y": y.detach(), "x_grad": x.grad, "grads": [shard(full, r) for r in range(N)]}

    def launch(self, inputs):
        x = inputs["x"].detach().clone().requires_grad_()
        per_rank = [([(w1.requires_grad_(), w2.requires_grad_()) for w1, w2 in shard(inputs["layers"], r)],)
                    for r in range(N)]
        return (x, inputs["target"]), per_rank

    def program(self, module):
        tp_forward = module.tp_forward

        def run(dist, x, target, shards):
            y = tp_forward(dist, x, shards)
            if not isinstance(y, torch.Tensor):
                raise TypeError(f"tp_forward must return y, a tensor [{B}, {D}]; it returned {type(y).__name__}")
            if y.shape != (B, D):
                raise TypeError(f"tp_forward must return y of shape [{B}, {D}], the whole output on every rank; it "
                                f"returned shape {list(y.shape)}")
            if not y.requires_grad:
                raise RuntimeError("tp_forward returned a y that autograd cannot differentiate (y.requires_grad is "
                                   "False): was it computed under torch.no_grad(), or detached?")
            loss_fn(y, target).backward()
            return {"y": y.detach(), "x_grad": x.grad,
                    "grads": [(w1.grad, w2.grad) for w1, w2 in shards]}

        return run

    def budgets(self, inputs):
        act, hidden = B * D * F64, B * HS * F64
        return {
            "peak memory": Budget(
                "peak memory", "2·W/N + L·(2·B·h/N + B·d)·8 + 4·B·d·8 bytes (weight shards W/N and their gradients "
                "W/N; per block the saved activations x@w1_r and gelu(x@w1_r) [B, h/N] and the block's output "
                "[B, d]; x, target and two [B, d] gradients)",
                2 * W // N + L * (2 * hidden + act) + 4 * act, "bytes"),
            "compute": Budget("compute", f"the rank's 1/N of the MLP, forward and backward, with the [B, d] work "
                              f"every rank repeats: {WORK.flops:,} (per block 2 forward and 4 backward matmuls of "
                              f"2·B·d·h/N, gelu on [B, h/N] and its backward, the residual add and the two input "
                              f"gradients' add on [B, d]; the loss's backward), + L·B·d for bookkeeping",
                              SHARE_FLOPS, "count"),
            "forward communication": Budget("forward communication", "L·2(N-1)/N·B·d·8 bytes (one all-reduce of "
                                            "a [B, d] activation per block, in g's forward)",
                                            L * ACTIVATION_ALL_REDUCE, "bytes"),
            "backward communication": Budget("backward communication", "L·2(N-1)/N·B·d·8 bytes (one all-reduce "
                                             "of a [B, d] gradient per block, in f's backward)",
                                             L * ACTIVATION_ALL_REDUCE, "bytes"),
        }

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        got = obs.results
        models = Models(inputs)
        checks = [
            values_check("output", [(f"rank {r}: y", got[r].get("y"), ref["y"], r) for r in range(N)], "outputs",
                         lambda bad: self.diagnose_output(bad, got, models, obs)),
            values_check("input gradient", [(f"rank {r}: x.grad", got[r].get("x_grad"), ref["x_grad"], r)
                                            for r in range(N)], "input gradients",
                         lambda bad: self.diagnose_grads(bad, got, ref, models, "x_grad", obs)),
            values_check("weight gradients", self.grad_pairs(got, ref), "shard gradients",
                         lambda bad: self.diagnose_grads(bad, got, ref, models, "grads", obs)),
        ]
        budgets = self.budgets(inputs)
        checks.append(compute_check(obs, budgets["compute"], self.diagnose_compute, least=PRODUCT_FLOPS))
        for phase in ("forward", "backward"):
            checks.append(communication_check(obs, budgets[f"{phase} communication"], f"{phase} communication",
                                              phase, lambda r, by_kind, phase=phase: self.diagnose_sent(phase, by_kind)))
        checks.append(self.memory_check(obs, budgets["peak memory"]))
        return checks

    @staticmethod
    def grad_pairs(got, ref):
        pairs = []
        for r in range(N):
            for i in range(L):
                pair = pair_at(got[r].get("grads"), i)
                cols, rows = f"[:, {r * HS}:{(r + 1) * HS}]", f"[{r * HS}:{(r + 1) * HS}, :]"
                expected = ref["grads"][r][i]
                pairs.append((f"rank {r}: shards[{i}].w1.grad (serial w1.grad{cols})", pair[0], expected[0],
                              (r, i, "w1")))
                pairs.append((f"rank {r}: shards[{i}].w2.grad (serial w2.grad{rows})", pair[1], expected[1],
                              (r, i, "w2")))
        return pairs

    @staticmethod
    def matching_mistake(got, models, mistakes, keys) -> str:
        """The diagnosis of the first replayed mistake that every rank's answer matches, or ''."""
        for name, (*_, text) in mistakes.items():
            if all(matches(g, m, keys) for g, m in zip(got, models.get(name))):
                return text
        return ""

    def diagnose_output(self, bad, got, models, obs: Observation) -> str:
        if weights_gathered(obs):
            return GATHERED
        text = self.matching_mistake(got, models, FORWARD_MISTAKES, ["y"])
        if text:
            return text
        forward = [sum(b for _, b in sent(obs, r, "forward").values()) for r in range(N)]
        if all(b == ACTIVATION_ALL_REDUCE for b in forward):
            return (f"every rank sent in forward exactly one all-reduce of a [B, d] activation, where the model has "
                    f"L = {L} blocks: the partial outputs were reduced once, at the end. Each block's input must be "
                    f"the whole output of the block before (every rank's partial sum added), so g all-reduces the "
                    f"partial output of every block, before its residual add")
        if self.ranks_disagree(got, "y"):
            return ("the ranks disagree on y: after g, every rank must hold the same, complete output (g's forward "
                    "all-reduces the partial outputs)")
        return ""

    def diagnose_grads(self, bad, got, ref, models, key, obs: Observation) -> str:
        if weights_gathered(obs):
            return GATHERED
        if not all(matches(g, ref, ["y"]) for g in got):
            return "the output is already wrong (see the output check): fix the forward first"
        text = self.matching_mistake(got, models, BACKWARD_MISTAKES, ["x_grad", "grads"])
        if text:
            return text
        if key == "grads" and all(m.meta[1] != L - 1 for m in bad):
            return ("the last block's weight gradients are right but earlier blocks' are not: the gradient "
                    "flowing back down the residual stream is wrong; check f's backward")
        if key == "x_grad" and all(g.get("x_grad") is None for g in got):
            return ("x.grad is None on every rank: the graph that tp_forward built does not reach x (was x "
                    "detached, or replaced, before the first block?)")
        if key == "x_grad" and self.ranks_disagree(got, "x_grad"):
            return ("the ranks disagree on x.grad: each rank's dL/dx is a partial sum (its w1_r sees only its "
                    "columns), so f's backward must all-reduce it")
        return ""

    @staticmethod
    def ranks_disagree(got, key) -> bool:
        values = [g.get(key) for g in got]
        if not all(isinstance(v, torch.Tensor) and v.shape == values[0].shape for v in values):
            return False
        return any((v - values[0]).abs().max().item() > MODEL_TOL * max(1.0, values[0].abs().max().item())
                   for v in values[1:])

    @staticmethod
    def diagnose_compute(rank, fwd, bwd) -> str:
        share = (fwd + bwd) / WORK.flops
        if share >= N - 0.5:  # the replicated [B, d] work does not grow with the weights: N x, less a little
            return (f"rank {rank} computed {share:.2f}x its share: the work of the whole MLP, as "
                    f"if with the full weights. Tensor parallelism multiplies each rank's own shards only")
        return f"rank {rank} computed {share:.2f}x its share of the MLP's work"

    @staticmethod
    def diagnose_sent(phase, by_kind) -> str:
        """Name the excess from the collectives that carried it."""
        gathered = sum(b for kind, (_, b) in by_kind.items() if kind.startswith(("all_gather", "broadcast")))
        if gathered >= (N - 1) * W // N // 2:
            return (f"the weights were gathered onto every rank ({fmt(gathered, 'bytes')} of gathers, at least half "
                    f"of the other ranks' shards): tensor parallelism keeps each weight split and moves only the "
                    f"[B, d] activations, with one all-reduce per block each way")
        if gathered:
            return ("activations were gathered: tensor parallelism moves the [B, d] activations with one all-reduce "
                    "per block each way (g's forward, f's backward)")
        count = by_kind.get("all_reduce", (0, 0))[0]
        if count == 2 * L and phase == "forward":
            return ("two all-reduces per block in forward: f's forward all-reduces as well as g's, or g's all-reduces "
                    "twice (the output check says which). f's forward is the identity; only g's all-reduces")
        if count == 2 * L:
            return ("two all-reduces per block in backward: g's backward all-reduces as well as f's, or f's "
                    "all-reduces twice (the gradient checks say which). g's backward is the identity")
        return ""

    def memory_check(self, obs, budget) -> Check:
        over = [(r, p) for r, p in enumerate(obs.peak_bytes) if p > budget.value]
        if not over:
            worst = max(obs.peak_bytes)
            return Check("peak memory", True, f"largest peak {fmt(worst, 'bytes')}, within the budget "
                                              f"{budget.describe()}", measured=worst, budget=budget)
        r, peak = max(over, key=lambda x: x[1])
        top = obs.ledgers[r]["peak_by_line"][:2]
        lines = "; ".join(f"{e['site']} ({fmt(e['bytes'], 'bytes')})" for e in top)
        message = (f"rank {r} peaked at {fmt(peak, 'bytes')}, over the budget {budget.describe()}. "
                   f"Largest at the peak: {lines}")
        diagnosis = ""
        if peak - budget.value >= W * (N - 1) // N // 2:
            diagnosis = (f"the rank held far more than its 1/{N} of the weights (W = {fmt(W, 'bytes')}, W/N = "
                         f"{fmt(W // N, 'bytes')}): full weights gathered onto every rank? Keep w1_r and w2_r "
                         "as they are and all-reduce activations instead")
        return Check("peak memory", False, message, measured=peak, budget=budget, diagnosis=diagnosis)


SPEC = TensorParallel()
