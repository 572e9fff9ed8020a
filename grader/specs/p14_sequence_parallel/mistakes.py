"""p14's diagnosis by replay, as p4's: all N ranks run together in one serial autograd graph, each with its own
tokens and its own pieces of the weights, linked only by the two sequence-parallel operators. Each direction of
each operator is one of a few ways to move the ranks' tensors:

    "cat"    every rank gets the ranks' tensors side by side along the sequence      (an all-gather)
    "rs"     every rank gets its own tokens of the ranks' sum                          (a reduce-scatter)
    "avg"    the same, divided by N                                                    (ReduceOp.AVG)
    "own"    every rank keeps its own tensor's tokens (no sum), or its own tensor where the others' tokens go
             (zeros elsewhere): no communication at all
    "stack"  the ranks' tensors stacked along dim 0 and read as the sequence without putting the tokens back in
             order (an all-gather into [N·b, s/N, d] reshaped to [b, s, d]); or, in a reduce-scatter, the sum cut
             along dim 0 of [b, s, d] instead of along the sequence

The right pair is gather = ("cat", "rs") and scatter = ("rs", "cat"), with the norms' gradients summed over the
ranks; each common mistake changes one of them. An answer whose values match a replayed mistake to float64
precision is named; one that matches none gets no likely cause."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from puzzles.model import TransformerWeights, causal_attention, rms_norm

from .layout import (B, D, HEADS, L, MATRICES, N, NORMS, S, SN, grads_of, sequence_loss, shard_layers, tokens)

MODEL_TOL = 1e-8


def _move(mode: str, tensors: list[torch.Tensor], full: bool) -> list[torch.Tensor]:
    """The ranks' tensors after one direction of an operator. `full`: the inputs are [b, s, d] (a reduce-scatter's
    direction); else [b, s/N, d] (an all-gather's)."""
    if mode == "cat":
        whole = torch.cat(tensors, dim=1)
        return [whole.clone() for _ in tensors]
    if mode == "stack":
        if full:
            total = sum(tensors)
            return [total.reshape(N, B, SN, D)[r].clone() for r in range(N)]
        whole = torch.stack(tensors).reshape(B, S, D)
        return [whole.clone() for _ in tensors]
    if mode in ("rs", "avg"):
        total = sum(tensors) / (N if mode == "avg" else 1)
        return [total[:, tokens(r)].clone() for r in range(N)]
    if mode == "own" and full:
        return [t[:, tokens(r)].clone() for r, t in enumerate(tensors)]
    if mode == "own":
        out = []
        for r, t in enumerate(tensors):
            padded = torch.zeros(B, S, D, dtype=t.dtype)
            padded[:, tokens(r)] = t
            out.append(padded)
        return out
    raise ValueError(mode)


class _Link(torch.autograd.Function):
    @staticmethod
    def forward(ctx, forward_mode, backward_mode, full, *tensors):
        ctx.mode, ctx.full = backward_mode, not full
        return tuple(_move(forward_mode, list(tensors), full))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, *_move(ctx.mode, list(grads), ctx.full))


def replay(inputs, gather=("cat", "rs"), scatter=("rs", "cat"), norms="sum", heads=HEADS // N) -> list[dict]:
    """Every rank's y, x.grad and weight gradients when the gather moves tensors as `gather` = (forward,
    backward), the reduce-scatter as `scatter`, the norms' gradients are combined over the ranks as `norms`
    ("sum", "own": not at all, "avg", "twice": summed twice), and each rank's attention columns are cut into
    `heads` heads."""
    weights = [[TransformerWeights(*(t.requires_grad_() for t in w)) for w in shard_layers(inputs["layers"], r)]
               for r in range(N)]
    xs = [inputs["x"][:, tokens(r)].clone().requires_grad_() for r in range(N)]
    hs = xs
    for i in range(L):
        for norm, branch in (("norm1", lambda n, w: causal_attention(n, w.wqkv, w.wo, heads)),
                             ("norm2", lambda n, w: F.gelu(n @ w.w1) @ w.w2)):
            gathered = _Link.apply(*gather, False, *[rms_norm(hs[r], getattr(weights[r][i], norm)) for r in range(N)])
            partials = [branch(gathered[r], weights[r][i]) for r in range(N)]
            hs = [h + o for h, o in zip(hs, _Link.apply(*scatter, True, *partials))]
    sum(sequence_loss(h, inputs["target"][:, tokens(r)]) / N for r, h in enumerate(hs)).backward()
    grads = [[grads_of(w) for w in ws] for ws in weights]
    for i in range(L):
        for name in NORMS:
            own = [grads[r][i][name] for r in range(N)]
            combined = {"sum": [sum(own)] * N, "own": own, "avg": [sum(own) / N] * N, "twice": [N * sum(own)] * N}
            for r in range(N):
                grads[r][i][name] = combined[norms][r]
    return [{"y": hs[r].detach(), "x_grad": xs[r].grad, "grads": grads[r]} for r in range(N)]


# name -> (replay's keyword arguments, the diagnosis). The forward mistakes are named from y alone; the backward
# ones (y right) from x.grad and every weight's gradient.
FORWARD_MISTAKES = {
    "scatter_average": (
        dict(scatter=("avg", "cat")),
        f"each block's branches are exactly {N}x too small: the reduce-scatter averaged the ranks' partial outputs "
        "(ReduceOp.AVG, or a division by the world size). The partial outputs of the row-parallel products (wo, "
        "w2) are pieces of one matrix product: sum them"),
    "scatter_without_sum": (
        dict(scatter=("own", "cat")),
        "each rank's output is built from its own heads' and columns' partial sums only: after wo and after w2, "
        "the ranks' partial outputs must be summed (a reduce-scatter), not just cut to this rank's tokens"),
    "gather_stacked": (
        dict(gather=("stack", "rs")),
        "the gathered sequence is out of order: all_gather_into_tensor stacks the ranks' [b, s/N, d] pieces along "
        "dim 0, [N·b, s/N, d], and reading that as [b, s, d] mixes the sequences' tokens. Put the chunks back "
        "along the sequence (from_sequence_chunks), or all_gather into a list and torch.cat(..., dim=1)"),
    "scatter_stacked": (
        dict(scatter=("stack", "cat")),
        "the reduce-scatter cut the summed [b, s, d] along dim 0 in memory, not along the sequence: each rank got "
        "the wrong tokens of the sum. Lay the tokens out as [N, b, s/N, d] first (sequence_chunks), so that chunk "
        "r is rank r's tokens"),
    "heads_not_divided": (
        dict(heads=HEADS),
        f"each rank's attention cut its {D // N} columns into all {HEADS} heads (of width {D // N // HEADS}) instead "
        f"of its own {HEADS // N} heads of width {D // HEADS}: causal_attention's n_heads is the number of heads in "
        f"the columns it is given, this rank's n_heads // N"),
}

NORM_MISTAKES = {  # how a norm weight's gradient on every rank relates to the serial one, e, and its diagnosis
    "averaged": (lambda got, e: all(close(g * N, e) for g in got),
                 f"they are exactly {N}x too small on every rank: averaged over the ranks (ReduceOp.AVG or a division "
                 "by the world size). Each rank's is the gradient of its own tokens' share of one loss: sum them"),
    "summed_twice": (lambda got, e: all(close(g, N * e) for g in got),
                     f"they are exactly {N}x too large on every rank: all-reduced twice (a hook and a Function, or a "
                     f"hook registered twice): once summed, every rank holds the total, and summing it again "
                     f"multiplies it by {N}"),
    "partial": (lambda got, e: close(sum(got), e),
                "on each rank they are the gradient of its own tokens only (their sum over the ranks is the serial "
                "gradient): every rank applies the norms to its s/N tokens, so their gradients are partial sums. "
                "All-reduce them (sum) in backward, with a hook on each norm weight or an autograd Function whose "
                "backward all-reduces"),
}


BACKWARD_MISTAKES = {
    "gather_backward_slice": (
        dict(gather=("cat", "own")),
        "the all-gather's backward took this rank's tokens of its own gradient without summing over the ranks: "
        "each rank's gradient of the gathered input is a partial sum (its heads, its columns only), so the "
        "backward must reduce-scatter it. (Slicing is right only where every rank computes the same thing from "
        "the gathered tensor, which tensor parallelism does not)"),
    "gather_backward_average": (
        dict(gather=("cat", "avg")),
        f"the all-gather's backward averaged the ranks' gradients (ReduceOp.AVG, or a division by {N}): its "
        "reduce-scatter must sum them, as the ranks' heads and columns add up to the whole block"),
    "scatter_backward_own": (
        dict(scatter=("rs", "own")),
        "the reduce-scatter's backward handed each rank only its own tokens' gradient (zeros, or nothing, for the "
        "others): every rank's partial output fed every token's sum, so the backward must all-gather the "
        "gradient along the sequence"),
    "norms_not_reduced": (dict(norms="own"), "the norms' weight gradients: " + NORM_MISTAKES["partial"][1]),
    "norms_averaged": (dict(norms="avg"), "the norms' weight gradients: " + NORM_MISTAKES["averaged"][1]),
    "norms_reduced_twice": (dict(norms="twice"), "the norms' weight gradients: " + NORM_MISTAKES["summed_twice"][1]),
}


def diagnose_norms(got: list[dict], want: list[dict]) -> str:
    """Which norm weights' gradients are off, and how, when one way covers them all (each norm weight alone: a
    hook on norm1 only leaves norm2's partial)."""
    off, kinds = [], set()
    for i in range(L):
        for name in NORMS:
            grads = [g.get("grads")[i].get(name) if isinstance(g.get("grads"), (list, tuple)) and
                     len(g.get("grads")) == L and isinstance(g.get("grads")[i], dict) else None for g in got]
            e = want[0]["grads"][i][name]
            if all(close(g, e) for g in grads):
                continue
            if not all(isinstance(g, torch.Tensor) and g.shape == e.shape for g in grads):
                return ""
            found = [kind for kind, (test, _) in NORM_MISTAKES.items() if test(grads, e)]
            if not found:
                return ""
            off.append(f"layers[{i}].{name}")
            kinds.add(found[0])
    if len(kinds) != 1:
        return ""
    return f"the norm weights' gradients {', '.join(off)}: {NORM_MISTAKES[kinds.pop()][1]}"


def close(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return False
    return (a.detach() - b).abs().max().item() <= MODEL_TOL * max(1.0, b.abs().max().item())


def matches(got: dict, expected: dict, keys) -> bool:
    for key in keys:
        if key == "grads":
            g = got.get("grads")
            if not isinstance(g, (list, tuple)) or len(g) != L:
                return False
            if not all(isinstance(w, dict) and all(close(w.get(k), v) for k, v in e.items())
                       for w, e in zip(g, expected["grads"])):
                return False
        elif not close(got.get(key), expected[key]):
            return False
    return True


def matches_matrices(got: dict, expected: dict) -> bool:
    """The weight matrices' gradients (not the norms') match."""
    g = got.get("grads")
    return isinstance(g, (list, tuple)) and len(g) == L and all(
        isinstance(w, dict) and all(close(w.get(k), e[k]) for k in MATRICES) for w, e in zip(g, expected["grads"]))


class Replays:
    """The replayed mistakes, computed on demand (only when an answer is wrong) and cached."""

    def __init__(self, inputs):
        self.inputs, self.cache = inputs, {}

    def get(self, name: str) -> list[dict]:
        if name not in self.cache:
            kwargs, _ = {**FORWARD_MISTAKES, **BACKWARD_MISTAKES}[name]
            self.cache[name] = replay(self.inputs, **kwargs)
        return self.cache[name]

    def matching(self, got: list[dict], mistakes: dict, keys) -> str:
        """The diagnosis of the first replayed mistake that every rank's answer matches, or ''."""
        for name, (_, text) in mistakes.items():
            if all(matches(g, m, keys) for g, m in zip(got, self.get(name))):
                return text
        return ""
