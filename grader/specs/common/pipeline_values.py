"""p5 and p6: the model cut into p stages, and what the gradients a pipeline returned say about its mistake.

A likely cause is named only when the evidence singles it out: a common factor that the stages' FLOPs explain, a
permutation of the microbatches' rows, gradients paired with the wrong microbatch's activations, weight gradients
that hold one microbatch's contribution only. Otherwise the diagnosis says what was measured and where, and lists
the candidates. Whatever a rank returned (None, a list, a tensor of another shape, dtype or with NaN), this module
only reads it.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import CostModel

from ...core.compare import ratio, tensor_mismatch
from ...core.rules import flops
from ...core.spec import Observation, pair_at
from .costs import ZERO, Cost, block_costs, loss_costs

P, M, B, D, H, L = 4, 8, 64, 64, 256, 8
PER = L // P  # blocks per stage
MB = B // M  # rows per microbatch
COST = CostModel(latency_ticks=0, bytes_per_tick=4096)
# One stage's work on one microbatch, every op counted (costs.py): its forward F (2 blocks: 4 matmuls, 2 gelus,
# 2 residual adds) and its backward BW (8 matmuls, 2 gelu backwards, 2 adds of input gradients, and the 4 weight
# gradients added into w.grad, which the grader hands every rank zeroed); the last stage also computes the
# microbatch's loss, forward LF and backward LB.
_BLOCK = block_costs(MB, D, H, COST, input_grad=True, accumulate=True)
FORWARD, BACKWARD = PER * _BLOCK[0], PER * _BLOCK[1]
LOSS_FORWARD, LOSS_BACKWARD = loss_costs(MB, D, COST, divide_by=M)
F_FLOPS = FORWARD.flops
PRODUCTS = 3 * PER * 2 * (2 * MB * D * H)  # a stage's matmuls for one microbatch: 2 per block forward, 4 backward
ALLOWANCE = M * MB * D  # room for bookkeeping: one elementwise op on each microbatch's [mb, d] gradient


def forward_cost(rank: int) -> Cost:
    """One microbatch's forward on `rank`'s stage (the last stage's includes the loss)."""
    return FORWARD + (LOSS_FORWARD if rank == P - 1 else ZERO)


def backward_cost(rank: int) -> Cost:
    return BACKWARD + (LOSS_BACKWARD if rank == P - 1 else ZERO)


STAGE_WORK = [M * (forward_cost(r) + backward_cost(r)) for r in range(P)]  # m forwards and m backwards per rank
TOLERANCE = Fraction(1, 200)  # half a percentage point above (p-1)/(m+p-1), for the 1-tick messages
WORK_SLACK = Fraction(1, 20)  # a rank's compute within 5% of its stage's work is that work (a cat, clones, bookkeeping)
CONTRACT = (f"the gradient of the loss with respect to the stage's input for the whole batch, a float64 tensor "
            f"[{B}, {D}], microbatch i in rows {MB}i to {MB}i+{MB - 1}")


def stage_of(layers, rank):
    return layers[rank * PER:(rank + 1) * PER]


def stage_grads(stage_layers, a, g=None, target=None):
    """(gradient of the stage input, [(w1 grad, w2 grad)]) of one stage at input rows `a`, backpropagating the
    output gradient `g`, or, on the last stage, the microbatch loss loss_fn(y, target) / m."""
    layers = [(w1.detach().requires_grad_(), w2.detach().requires_grad_()) for w1, w2 in stage_layers]
    a = a.detach().requires_grad_()
    y = forward(a, layers)
    ws = [w for pair in layers for w in pair]
    if target is not None:
        grads = torch.autograd.grad(loss_fn(y, target) / M, [a, *ws])
    else:
        grads = torch.autograd.grad(y, [a, *ws], g)
    return grads[0], [(grads[1 + 2 * j], grads[2 + 2 * j]) for j in range(len(layers))]


def value_pairs(obs: Observation, ref) -> tuple[list, list]:
    """(label, got, expected, (rank, layer in stage or None, "w1" | "w2" | "input")) for every stage weight's
    gradient and every returned input gradient."""
    grad_pairs, input_pairs = [], []
    for r, res in enumerate(obs.results):
        res = res if isinstance(res, dict) else {}
        for j in range(PER):
            k = r * PER + j
            pair = pair_at(res.get("grads"), j)
            for which, g, e in (("w1", pair[0], ref["grads"][k][0]), ("w2", pair[1], ref["grads"][k][1])):
                grad_pairs.append((f"rank {r}: layers[{j}].{which}.grad (block {k})", g, e, (r, j, which)))
        what = "dL/dx" if r == 0 else f"dL/d(stage {r} input)"
        input_pairs.append((f"rank {r}: the returned input gradient ({what})", res.get("input_grad"),
                            ref["input_grads"][r], (r, None, "input")))
    return grad_pairs, input_pairs


def close(got, expected) -> bool:
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    scale = max(1.0, expected.abs().max().item())
    return bool((got.detach().double() - expected).abs().max().item() <= 1e-8 * scale)


def match_chunks(got, expected) -> list[int] | None:
    """For each got chunk, the index of the expected chunk it equals; None if some chunk equals none."""
    perm = []
    for c in got:
        j = next((j for j, e in enumerate(expected) if close(c, e)), None)
        if j is None:
            return None
        perm.append(j)
    return perm


def wrong_slot(rank, perm) -> str:
    i = next(i for i, j in enumerate(perm) if i != j)
    return (f"rank {rank} returned its input gradients in the wrong order: rows {MB * i}-{MB * i + MB - 1} hold "
            f"microbatch {perm[i]}'s gradient, not microbatch {i}'s. Put microbatch i's at rows "
            f"{MB}i to {MB}i+{MB - 1}")


def diagnose_values(spec, obs: Observation, ref, inputs, grad_pairs, input_pairs) -> str:
    """The likely mistake behind the wrong gradients, or what was measured where when several mistakes fit."""
    bad = [(meta, got, expected) for _, got, expected, meta in grad_pairs + input_pairs
           if tensor_mismatch(got, expected) is not None]
    if not bad:
        return ""
    malformed = next(((meta, got, e) for meta, got, e in bad if not isinstance(got, torch.Tensor)
                      or got.shape != e.shape or got.dtype != e.dtype or not torch.isfinite(got).all()), None)
    if malformed is not None:
        return diagnose_malformed(*malformed)
    factors = [ratio(got, e) for _, got, e in bad]
    if None not in factors and max(factors) - min(factors) < 1e-6 * max(1.0, abs(factors[0])):
        return diagnose_factor(factors[0], obs, getattr(spec, "backward_flops", None))
    top = max(meta[0] for meta, _, _ in bad)
    return diagnose_rank(spec, top, bad, obs.results[top], ref, inputs)


def diagnose_malformed(meta, got, expected) -> str:
    rank, j, which = meta
    if which == "input":
        if got is None and rank == 0:
            return ("rank 0 returned no dL/dx: make each of its microbatches a leaf that requires grad "
                    "(x.chunk(n_micro)[i].detach().requires_grad_()), so that backward computes its gradient, and "
                    "return the microbatches' gradients concatenated")
        if got is None:
            return f"rank {rank} returned None; the step returns {CONTRACT}"
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype:
            return ""  # right shape, not finite: the message says where
        return f"rank {rank} returned something other than {CONTRACT} (see the message)"
    if got is None:
        return (f"rank {rank}'s layers[{j}].{which}.grad is None after the step: the grader hands every weight a "
                f"zero .grad and backward adds into it. Was it set to None (zero_grad) or the weight replaced?")
    return ""  # the message says what is wrong with it


def diagnose_factor(f: float, obs: Observation, backward_flops=None) -> str:
    """Every wrong gradient is f times the serial one. The backward FLOPs tell a scaled loss from a repeated
    backward."""
    per_microbatch = backward_flops or (lambda r: backward_cost(r).flops)  # p17 splits it: B + W
    backwards = [flops(obs, r, "backward") / (M * per_microbatch(r)) for r in range(P)]
    # Every op counts, so the loss's own few ops (a division by m forgotten, say) move these ratios by a hair.
    once = all(abs(b - 1) < 0.02 for b in backwards)
    if once and abs(f - M) < 1e-6:
        return (f"exactly {M}x the reference, everywhere: the microbatch losses were added, not averaged. The "
                f"full-batch loss is the mean of the m = {M} microbatch losses: scale each by 1/{M}")
    if once and abs(f - 1 / M) < 1e-9:
        return f"exactly 1/{M} of the reference, everywhere: the loss was scaled by 1/m twice (by 1/{M * M})?"
    if once and f > 0 and abs(M / f - round(M / f)) < 1e-6:
        k = round(M / f)
        stages = " (p, the number of stages, instead of m, the number of microbatches?)" if k == P else ""
        return (f"exactly {f:g}x the reference, everywhere, and every microbatch was backpropagated once: each "
                f"microbatch's loss was divided by {k} instead of m = {M}{stages}")
    if not once and all(abs(b - f) < 0.02 * f for b in backwards):
        return (f"exactly {f:g}x the reference, everywhere, and every rank ran {f:g}x the backward FLOPs of its "
                f"microbatches: each microbatch was backpropagated {f:g} times")
    return (f"every wrong gradient is exactly {f:.6g}x the serial one; the ranks ran "
            f"{', '.join(f'{b:.2f}' for b in backwards)}x their microbatches' backward FLOPs. Each microbatch's loss "
            f"is loss_fn(y, target_i) / {M}, backpropagated once")


def diagnose_rank(spec, top, bad, res, ref, inputs) -> str:
    """`top` is the highest rank that is off: every stage after it is right, so its mistake is its own."""
    stage_layers = stage_of(inputs["layers"], top)
    a = ref["acts"][top].chunk(M)
    last = top == P - 1
    targets = inputs["target"].chunk(M) if last else [None] * M
    g = [None] * M if last else ref["input_grads"][top + 1].chunk(M)
    inputs_off = any(meta == (top, None, "input") for meta, _, _ in bad)
    weights_off = [meta for meta, _, _ in bad if meta[0] == top and meta[2] != "input"]
    dx = res.get("input_grad") if isinstance(res, dict) else None
    if inputs_off:
        got, expected = dx.chunk(M), ref["input_grads"][top].chunk(M)
        perm = match_chunks(got, expected)
        if perm is not None and perm != list(range(M)):
            return wrong_slot(top, perm)
        if not last:
            pairing = [next((j for j in range(M) if close(stage_grads(stage_layers, a[i], g[j])[0], got[i])), None)
                       for i in range(M)]
            if None not in pairing and pairing != list(range(M)):
                wrong = [(i, j) for i, j in enumerate(pairing) if i != j]
                shown = ", ".join(f"microbatch {i}'s activations got microbatch {j}'s gradient" for i, j in wrong[:3])
                more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
                return (f"gradient received for the wrong microbatch: rank {top} backpropagated the gradients that "
                        f"rank {top + 1} sent through the activations of other microbatches ({shown}{more}). "
                        f"{spec.pairing_hint()}")
    elif weights_off:
        got = [pair_at(res["grads"], j) for j in range(PER)]
        for i in range(M):
            contribution = stage_grads(stage_layers, a[i], g[i], targets[i])[1]
            if all(close(got[j][k], contribution[j][k]) for j in range(PER) for k in range(2)):
                return (f"rank {top}'s input gradients are right, but its weight gradients hold microbatch {i}'s "
                        f"contribution only: w.grad was overwritten (or zeroed) instead of accumulating over the "
                        f"{M} microbatches. Backward adds into w.grad by itself: leave it alone between microbatches")
        if [meta[1:] for meta in weights_off] == [(0, "w1")]:
            return (f"rank {top}'s input gradients and weight gradients are right but for layers[0].w1.grad, the one "
                    f"gradient computed from the stage's input activations themselves: were they overwritten before "
                    f"their backward (one receive buffer reused for several microbatches)?")
        return (f"rank {top}'s input gradients are right, but {len(weights_off)} of its {2 * PER} weight gradients "
                f"are not the sum of its microbatches' contributions. Was w.grad set, zeroed or replaced during the "
                f"step, or a weight changed between a microbatch's forward and its backward?")
    if last:
        return (f"rank {top}, the last stage, is off although it needs no one's gradient: its own forward, loss or "
                f"backward of some microbatch differs from the serial one. Microbatch i's loss is "
                f"loss_fn(y_i, target.chunk({M})[i]) / {M}, backpropagated through the graph of the same microbatch")
    return (f"rank {top} is the last stage that is off (ranks {top + 1} to {P - 1} after it are right): its own "
            f"forward or backward of some microbatch went wrong. Does each gradient it receives go through the graph "
            f"of the same microbatch, and do its w.grad accumulate (not overwrite) over all {M} microbatches?")
