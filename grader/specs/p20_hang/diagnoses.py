"""p20's likely causes, named only when the evidence singles one out.

A step that went wrong is replayed from the rank's own weights before it, under each way of getting it wrong
(layout.NORMALIZATIONS x layout.SELECTIONS): when exactly one replay gives the rank's weights, that is the mistake.
The loss a rank returned is compared the same way, and the bytes it sent against the one all-reduce per step.
"""

from __future__ import annotations

import torch

from ...core.compare import ratio
from . import layout as lay

_CAUSES = {
    ("mean of means", "every row"): (
        "each rank divided its squared errors by its own count of real rows and the ranks' results were averaged "
        "(a mean of means): with counts that differ, that weighs each rank's rows by 1/(N·n_r), not 1/n. All-reduce "
        "the count of real rows first (torch.tensor(float(rows.shape[0])), SUM), and divide every rank's sum by that"),
    ("sum of means", "every row"): (
        "each rank divided by its own count of real rows and the ranks' results were summed: divide every rank's "
        "sum of squared errors by the count of every rank's real rows (all-reduced), not by its own"),
    ("padding counted", "every row"): (
        "the loss was divided by every row, padding included (N·8 = 32): divide by the real rows only, every rank's "
        "count all-reduced"),
    ("global mean", "skipped step"): (
        "every rank skipped a step at which some rank had no real row (the ranks agreed to do less): that step's "
        "other rows were never learned from. The rank with no real row must still take part, with a gradient of "
        "zeros (torch.zeros_like(w))"),
    ("global mean", "fewest microbatches"): (
        "every rank ran as many microbatches as the rank with the fewest (the rows beyond were dropped): the "
        "collectives agree, but the step is not the whole batch's. Run all of a rank's microbatches, with no "
        "collective inside the loop, then all-reduce once"),
}


def _close(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and bool(torch.allclose(a.detach(), b.detach(), rtol=1e-8, atol=1e-12)))


def _same_layers(a, b) -> bool:
    return all(_close(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def diagnose_weights(inputs, run: str, s: int, rank: int, before, got) -> str:
    step, lr = inputs["runs"][run]["steps"][s], inputs["lr"]
    counts = [int(lay.shard(step, r)[2].sum()) for r in range(lay.N)]
    if _same_layers(got, before):
        empty = [r for r, c in enumerate(counts) if c == 0]
        why = (f"rank {empty[0]} had no real row at that step" if empty else "no rank's share was empty")
        return (f"rank {rank}'s weights did not change at run {run} step {s} ({why}): the step was skipped. Every "
                f"rank must take every step; a rank with no real row adds a gradient of zeros")
    matches = []
    for normalization in lay.NORMALIZATIONS:
        for selection in lay.SELECTIONS:
            if (normalization, selection) == ("global mean", "every row"):
                continue
            replay, _ = lay.sgd_step(before, step, lr, normalization, selection)
            if _same_layers(got, replay):
                matches.append((normalization, selection))
    known = [m for m in matches if m in _CAUSES]
    # At a step where no rank is empty, "skipped step" changes nothing: ("mean of means", "skipped step") is then
    # ("mean of means", "every row"). The one known cause is named when every other match shares a part of it.
    if len(known) == 1 and all(m[0] == known[0][0] or m[1] == known[0][1] for m in matches):
        return _CAUSES[known[0]]
    right, _ = lay.sgd_step(before, step, lr)
    flat = lambda layers: torch.cat([w.detach().reshape(-1) for pair in layers for w in pair])  # noqa: E731
    off = float((flat(got) - flat(right)).norm() / max(float((flat(right) - flat(before)).norm()), 1e-300))
    if off < 1e-4:
        return (f"rank {rank}'s update at run {run} step {s} differs from the serial step's by {off:.1e} of its size: "
                f"the arithmetic is right, but rounded, as float32 (or half) rounds. Keep the gradients, the "
                f"loss and what you send in float64, the weights' dtype")
    k = ratio(flat(got) - flat(before), flat(right) - flat(before))
    if k is not None and abs(k * lay.N - 1) < 1e-6:
        return (f"rank {rank}'s update at run {run} step {s} is exactly 1/{lay.N} of the serial step: the all-reduced "
                f"gradient was divided by the world size. Each rank's share is already divided by the count of every "
                f"rank's real rows, so the shares add up (SUM) to the gradient")
    if k is not None and abs(k - lay.N) < 1e-6:
        return (f"rank {rank}'s update at run {run} step {s} is exactly {lay.N}x the serial step: the gradient of "
                f"the loss is divided by the count of every rank's real rows once, and the all-reduce sums the shares")
    if counts[rank] == 0 and not _same_layers(got, right):
        return (f"rank {rank} had no real row at run {run} step {s}, and its weights are not the others': its update "
                f"must be the all-reduced gradient every rank applies (its own share is zeros)")
    return ""


def diagnose_loss(inputs, run: str, s: int, rank: int, before, got) -> str:
    step = inputs["runs"][run]["steps"][s]
    if got is None:
        return (f"rank {rank} returned no loss at run {run} step {s}: it skipped the step? Every rank returns the "
                f"step's loss, all-reduced: the same number everywhere")
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        return ""
    layers = [(w1.detach(), w2.detach()) for w1, w2 in before]
    with torch.no_grad():
        for normalization, cause in (("mean of means", "a mean of the ranks' means"),
                                     ("sum of means", "the sum of the ranks' means"),
                                     ("padding counted", "divided by every row, padding included")):
            if _close(got.reshape(()), lay.step_loss(layers, step, normalization)):
                return (f"rank {rank}'s loss at run {run} step {s} is {cause}: the loss is the squared errors of "
                        f"every rank's real rows divided by their count, all-reduced")
        x, target, valid = lay.shard(step, rank)
        own = ((lay.forward(x[valid], layers) - target[valid]) ** 2).sum() if valid.any() else None
        total = sum(int(lay.shard(step, r)[2].sum()) for r in range(lay.N))
        if own is not None and _close(got.reshape(()), own / total):
            return (f"rank {rank}'s loss at run {run} step {s} is its own share only: all-reduce it (SUM) so that "
                    f"every rank logs the whole batch's loss")
    return ""


def diagnose_communication(rank: int, by_kind: dict) -> str:
    reduced = by_kind.get("all_reduce", (0, 0))[1]
    if reduced >= 1.5 * lay.STEPS_IN_ALL * lay.ALL_REDUCE_BYTES:
        return (f"rank {rank}'s all-reduces sent {reduced / (lay.STEPS_IN_ALL * lay.ALL_REDUCE_BYTES):.2f}x one "
                f"all-reduce of the gradients per step: a collective per microbatch (made to agree by empty ones on "
                f"the ranks with fewer?). backward() adds each microbatch's gradient into w.grad: all-reduce once, "
                f"after the last microbatch (DDP's no_sync())")
    return ""
