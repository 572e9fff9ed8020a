"""p4 tensor parallel: the Megatron MLP, column-parallel w1 and row-parallel w2, joined by the conjugate
operators f (identity forward, all-reduce backward) and g (all-reduce forward, identity backward).

Diagnosis works by replaying the common mistakes: all N ranks run together in one serial autograd graph, with f
and g replaced by operators whose forward and backward are each "keep your own" or "sum over the ranks" (times k).
An answer that matches one mistaken pair to float64 precision is named."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ..core.compare import values_check
from ..core.result import Budget, Check, fmt
from ..core.spec import Observation, PuzzleSpec

N, B, D, H, L = 4, 32, 64, 512, 3
HS = H // N  # hidden columns per rank
F64 = 8
W = 2 * L * D * H * F64  # bytes of all the weights
MODEL_TOL = 1e-8


def shard(layers, rank):
    """Rank r's pieces: the r-th column block of w1 and the r-th row block of w2, for every block."""
    cols = slice(rank * HS, (rank + 1) * HS)
    return [(w1.detach()[:, cols].clone(), w2.detach()[cols, :].clone()) for w1, w2 in layers]


# ---- replaying mistakes. All N ranks run together in one serial autograd graph, each with its own copy of x and
# its own shards; the only link between them is `_Link`, an operator on the N ranks' tensors whose forward and
# backward are each one of: keep each rank's own tensor ("id"), or give every rank the sum ("sum") times k.
# The right answer is in = ("id", "sum") (f) and out = ("sum", "id") (g); each common mistake changes one of them.

ID, SUM, AVG, TWICE = ("id", 1), ("sum", 1), ("sum", 1 / N), ("sum", N)


def _combine(mode, tensors):
    op, k = mode  # (autograd hands backward zeros, never None, for outputs that got no gradient)
    if op == "id":
        return [t * k if k != 1 else t.clone() for t in tensors]
    total = sum(tensors)
    return [total * k if k != 1 else total.clone() for _ in tensors]


class _Link(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fwd, bwd, *tensors):
        ctx.bwd = bwd
        return tuple(_combine(fwd, tensors))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *_combine(ctx.bwd, grads))


def replay(inputs, f_mode, g_mode):
    """Every rank's y, x.grad and shard gradients when f is `f_mode` = (forward, backward) and g is `g_mode`."""
    shards = [[(w1.requires_grad_(), w2.requires_grad_()) for w1, w2 in shard(inputs["layers"], r)]
              for r in range(N)]
    xs = [inputs["x"].detach().clone().requires_grad_() for _ in range(N)]
    hs = xs
    for i in range(L):
        ins = _Link.apply(*f_mode, *hs)
        partials = [F.gelu(ins[r] @ shards[r][i][0]) @ shards[r][i][1] for r in range(N)]
        outs = _Link.apply(*g_mode, *partials)
        hs = [h + o for h, o in zip(hs, outs)]
    sum(loss_fn(h, inputs["target"]) for h in hs).backward()  # the ranks' graphs meet only in _Link
    return [{"y": hs[r].detach(), "x_grad": xs[r].grad, "grads": [(w1.grad, w2.grad) for w1, w2 in shards[r]]}
            for r in range(N)]


# name -> (f's (forward, backward), g's (forward, backward), the diagnosis). The forward mistakes are named from
# y alone; the backward ones (y right) from x.grad and the shard gradients.
FORWARD_MISTAKES = {
    "f_forward_reduces": (
        (SUM, SUM), (SUM, ID),
        "the output is what you get when f's forward all-reduces too: every rank already holds the whole x, so "
        f"summing it over the ranks feeds {N}·x into the block (all-reduce in both f and g?). f's forward is the "
        "identity; only g's forward all-reduces"),
    "g_average": (
        (ID, SUM), (AVG, ID),
        f"the MLP branch is exactly {N}x too small: g's forward averaged the partial outputs (ReduceOp.AVG or a "
        "division by the world size). The partials a_r @ w2_r are pieces of one matrix product: sum them"),
    "g_forward_no_reduce": (
        (ID, SUM), (ID, ID),
        "each rank's output is built from its own partial sums a_r @ w2_r only: g's forward must all-reduce "
        "(sum) the partial outputs of the row-parallel layer"),
    "branch_twice": (
        (ID, SUM), (TWICE, ID),
        f"the MLP branch is exactly {N}x too large: the output was all-reduced twice (once the partials are "
        f"summed, every rank holds the same tensor, and summing it again multiplies it by {N})"),
    "f_g_swapped": (
        (SUM, ID), (ID, SUM),
        "f and g are swapped: the input went through an all-reduce (summing the ranks' copies of x) and the "
        "partial outputs did not. f (identity forward) goes before w1, g (all-reduce forward) after w2"),
}

BACKWARD_MISTAKES = {
    "f_backward_identity": (
        (ID, ID), (SUM, ID),
        "x.grad on each rank holds only that rank's share of the branch's input gradient: f's backward must "
        "all-reduce (sum) the partial input gradients, since each rank's w1_r sees only its own columns"),
    "g_backward_reduces": (
        (ID, SUM), (SUM, SUM),
        f"the gradients through the MLP branch are exactly {N}x too large (the last block's weight gradients "
        f"are {N}x the serial ones): g's backward all-reduces too. Every rank already holds the whole dL/dy, "
        "so g's backward is the identity"),
    "f_backward_average": (
        (ID, AVG), (SUM, ID),
        f"the branch's input gradient is {N}x too small: f's backward averaged (ReduceOp.AVG or a division by "
        "the world size); the ranks' partial input gradients must be summed"),
    "reduce_in_g_backward": (
        (ID, ID), (SUM, SUM),
        "the backward all-reduce is in g instead of f: g's backward should be the identity (every rank holds the "
        "whole dL/dy), and f's backward should all-reduce the partial input gradients"),
}


def matches(got, expected, keys) -> bool:
    def close(a, b):
        if not isinstance(a, torch.Tensor) or b is None or a.shape != b.shape:
            return False
        return (a - b).abs().max().item() <= MODEL_TOL * max(1.0, b.abs().max().item())

    for key in keys:
        if key == "grads":
            g = got.get("grads") or []
            if len(g) != L or any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in g):
                return False
            if not all(close(a, b) for pa, pb in zip(g, expected["grads"]) for a, b in zip(pa, pb)):
                return False
        elif not close(got.get(key), expected[key]):
            return False
    return True


class TensorParallel(PuzzleSpec):
    id, name, title = "p4", "tensor_parallel", "Tensor parallel"
    entries = ("CopyToTensorParallel", "ReduceFromTensorParallel", "tp_forward")
    world_size = N
    cost = CostModel()
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
            "forward all-reduces": Budget("forward all-reduces", "L (one per block, in g's forward)", L, "count"),
            "backward all-reduces": Budget("backward all-reduces", "L (one per block, in f's backward)", L, "count"),
        }

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        got = obs.results
        models = _Models(inputs)
        checks = [
            values_check("output", [(f"rank {r}: y", got[r].get("y"), ref["y"], r) for r in range(N)], "outputs",
                         lambda bad: self.diagnose_output(bad, got, models)),
            values_check("input gradient", [(f"rank {r}: x.grad", got[r].get("x_grad"), ref["x_grad"], r)
                                            for r in range(N)], "input gradients",
                         lambda bad: self.diagnose_grads(bad, got, ref, models, "x_grad")),
            values_check("weight gradients", self.grad_pairs(got, ref), "shard gradients",
                         lambda bad: self.diagnose_grads(bad, got, ref, models, "grads")),
        ]
        budgets = self.budgets(inputs)
        checks.append(self.count_check(obs, "forward", budgets["forward all-reduces"]))
        checks.append(self.count_check(obs, "backward", budgets["backward all-reduces"]))
        checks.append(self.memory_check(obs, budgets["peak memory"]))
        return checks

    @staticmethod
    def grad_pairs(got, ref):
        pairs = []
        for r in range(N):
            grads = got[r].get("grads") or []
            for i in range(L):
                pair = grads[i] if i < len(grads) and isinstance(grads[i], (tuple, list)) else (None, None)
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

    def diagnose_output(self, bad, got, models) -> str:
        text = self.matching_mistake(got, models, FORWARD_MISTAKES, ["y"])
        if text:
            return text
        if self.ranks_disagree(got, "y"):
            return ("the ranks disagree on y: after g, every rank must hold the same, complete output (g's forward "
                    "all-reduces the partial outputs)")
        return ""

    def diagnose_grads(self, bad, got, ref, models, key) -> str:
        if not all(matches(g, ref, ["y"]) for g in got):
            return "the output is already wrong (see the output check): fix the forward first"
        text = self.matching_mistake(got, models, BACKWARD_MISTAKES, ["x_grad", "grads"])
        if text:
            return text
        if key == "grads" and all(m.meta[1] != L - 1 for m in bad):
            return ("the last block's weight gradients are right but earlier blocks' are not: the gradient "
                    "flowing back down the residual stream is wrong; check f's backward")
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

    def count_check(self, obs, phase, budget) -> Check:
        name = f"{phase} all-reduces"
        for r in range(N):
            reduces = obs.events_of(r, "comm", "all_reduce", phase)
            if len(reduces) != budget.value:
                sizes = sorted({e["nbytes"] for e in reduces})
                other = [e for e in obs.events_of(r, "comm", phase=phase) if e["kind"] != "all_reduce"]
                also = ""
                if other:
                    kinds = sorted({e["kind"] for e in other})
                    also = (f"; it also issued {len(other)} other collective(s) ({', '.join(kinds)}, "
                            f"{fmt(sum(e['nbytes'] for e in other), 'bytes')} in all)")
                message = (f"rank {r} issued {len(reduces)} all-reduce(s) in {phase}"
                           f"{' (sizes: ' + ', '.join(fmt(s, 'bytes') for s in sizes) + ')' if sizes else ''}{also}; "
                           f"expected {budget.describe()}, each of a [B, d] activation, B·d·8 = "
                           f"{fmt(B * D * F64, 'bytes')}")
                return Check(name, False, message, measured=len(reduces), budget=budget,
                             diagnosis=self.count_diagnosis(phase, len(reduces), other))
        return Check(name, True, f"every rank issued {int(budget.value)} all-reduces in {phase}, as expected: "
                                 f"{budget.describe()}",
                     measured=int(budget.value), budget=budget)

    @staticmethod
    def count_diagnosis(phase, count, other) -> str:
        if other and any(e["kind"].startswith(("all_gather", "broadcast")) for e in other):
            return ("weights (or activations) were gathered: tensor parallelism keeps each weight split and "
                    "moves only the [B, d] activations, with one all-reduce per block each way")
        if phase == "forward":
            if count == 2 * L:
                return ("two all-reduces per block in forward: all-reduce in both f and g (or twice in g)? f's "
                        "forward is the identity (every rank already holds the whole x); only g's forward all-reduces")
            if count == 0:
                return "no all-reduce in forward: g's forward must sum the partial outputs with an all-reduce"
        else:
            if count == 2 * L:
                return ("two all-reduces per block in backward: g's backward all-reduces too? It is the identity "
                        "(every rank already holds the whole dL/dy)")
            if count == 0:
                return "no all-reduce in backward: f's backward must all-reduce the partial input gradients"
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


class _Models:
    """The replayed mistakes, computed on demand (only when an answer is wrong) and cached."""

    def __init__(self, inputs):
        self.inputs, self.cache = inputs, {}

    def get(self, name):
        if name not in self.cache:
            f_mode, g_mode, _ = {**FORWARD_MISTAKES, **BACKWARD_MISTAKES}[name]
            self.cache[name] = replay(self.inputs, f_mode, g_mode)
        return self.cache[name]


SPEC = TensorParallel()
