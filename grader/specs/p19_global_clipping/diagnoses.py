"""p19's likely causes, each named only when the evidence singles it out: a wrong norm by the value it matches
among the common mistakes' (clipping_layout.norm_candidates, at the serial gradient of the answer's own weights), a
wrong update by a replay of the serial run with the mistake in it, a step not skipped alike by who changed what and
which norms were finite, and the bytes and state over budget by their kind and the tensors the optimizer keeps."""

from __future__ import annotations

import math

import torch

from ...core.rules import BOOKKEEPING_BYTES, sized_like
from . import layout as lay
from .layout import (D, F64, FAULTS, N, PARAM_NAMES, PSI_RANK, REDUCTION, SHARD, STEPS_IN_ALL, T, TOL, run_of)


REPLAYED = (
    ({"clamp": False}, "the clipping coefficient max_norm / (norm + 1e-6) was applied at every step, also where it is "
                       "above 1 (the norm below max_norm, step 1 and 4): clip_grad_norm_ clamps it, min(1, ...), so "
                       "that small gradients are never scaled up"),
    ({"clip": False}, "the gradients were not clipped: multiply them by min(1, max_norm / (norm + 1e-6)) before Adam"),
    ({"count_skipped": True}, "Adam's step count t counted the skipped step 3: a skipped step changes nothing, its "
                              "count included (at step 4, t = 3: steps 1, 2 and 4 were taken)"),
)


def weights_before(res, inputs, run, step, rank):
    """What `rank` held before `step` of `run` (a list in PARAM_NAMES order), or None when it was not recorded."""
    if step == 1:
        return lay.rank_params(inputs["params"], rank)
    w = pairs_of(run_of(res[rank], run).get("weights"))
    return w[step - 2] if step - 2 < len(w) else None


def replicas_agree(res, inputs, run, step) -> bool:
    """Whether, before `step`, every rank held the same weights as the other replica's rank of its slice: only then
    is there one model whose gradient's norm the ranks should report."""
    for r in range(N):
        mine, theirs = weights_before(res, inputs, run, step, r), weights_before(res, inputs, run, step, (r + T) % N)
        if mine is None or theirs is None or len(mine) != len(theirs) or any(
                not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape
                or not torch.allclose(a, b, rtol=0, atol=TOL * max(1.0, b.abs().max().item()))
                for a, b in zip(mine, theirs)):
            return False
    return True


def forced_gradient(res, inputs, run, step, rank, batches):
    """The serial gradient of `step` at the weights the answer's tensor-parallel pair of `rank` held before it (the
    replicated ones `rank`'s own), or None when they are not finite."""
    pair = [weights_before(res, inputs, run, step, r) for r in lay.tp_ranks(rank)]
    own = weights_before(res, inputs, run, step, rank)
    if any(p is None or len(p) != len(PARAM_NAMES) for p in pair + [own]):
        return None
    params = lay.assemble(pair, own)
    if not all(torch.isfinite(t).all() for t in params.values()):
        return None
    return lay.gradient(params, batches[step - 1])


def never_gathered(res, inputs, step, expected) -> bool:
    """Whether, at `step`, every rank updated its own shard (its block's parameters match the reference) and left
    the other replica's half as it was before the step: the updated shards were never all-gathered."""
    per_block = len(PARAM_NAMES) // lay.L
    for r in range(N):
        dp, _ = lay.coords(r)
        after = pairs_of(res[r].get("weights"))
        after = after[step - 1] if step - 1 < len(after) else None
        before = weights_before(res, inputs, "main", step, r)
        if after is None or before is None:
            return False
        for i, name in enumerate(PARAM_NAMES):
            mine = i // per_block == dp
            want = lay.rank_slice(name, expected[name], r) if mine else before[i]
            if not isinstance(after[i], torch.Tensor) or after[i].shape != want.shape or \
                    not torch.allclose(after[i], want, rtol=0, atol=TOL * max(1.0, want.abs().max().item())):
                return False
            if not mine and torch.equal(before[i], lay.rank_slice(name, expected[name], r)):
                return False  # nothing told: the weight did not change in the reference either
    return True


def diagnose_norm(got, grads, rank, want) -> str:
    if not isinstance(got, float):
        return "step() must return the global norm, a number (a float or a tensor of one element)"
    hits = [text for value, text in lay.norm_candidates(grads, rank) if abs(got - value) <= TOL * max(1.0, value)]
    coef = min(1.0, lay.MAX_NORM / (want + lay.CLIP_EPS))
    if coef < 1 and abs(got - want * coef) <= TOL * max(1.0, want):
        hits.append("the norm after clipping (max_norm): report the norm before clipping, as clip_grad_norm_ returns")
    return hits[0] if len(hits) == 1 else ""


def diagnose_finite_norm(res, run, step, rank) -> str:
    if run == "main" and step == FAULTS[1].step and _all_finite_at(res, run, step) and \
            not _all_finite_at(res, "main", FAULTS[0].step):
        return _COPY_UNSEEN
    return (f"rank {rank}'s norm did not include the other ranks' squares (a local norm, or an all-reduce over one "
            f"group only)")


_COPY_UNSEEN = (f"at step {FAULTS[1].step} the inf is in rank {FAULTS[1].rank}'s copy of {FAULTS[1].param}, a "
                f"replicated parameter (the other copy, on rank {lay.tp_ranks(FAULTS[1].rank)[0]}, is finite), and "
                f"no rank's norm saw it: a replicated parameter counted on one rank of the pair only. Count it once in the norm, but "
                f"let every copy's inf or NaN through: divide its squares by {T} on each rank of the pair, or check "
                f"every gradient for inf and NaN and all-reduce that flag too")


def _all_finite_at(res, run, step) -> bool:
    return all(_norm_at(res, run, step, r) is not None and math.isfinite(_norm_at(res, run, step, r))
               for r in range(N))


def diagnose_skip(res, run, fault, found) -> str:
    """Name why the ranks did not all skip, from who changed what and the norms they reported at that step."""
    own = [[c for c in (cs or []) if not c["path"].startswith("layers[")] for cs in found]  # the optimizer's own
    took = [r for r in range(N) if own[r]]
    finite = [r for r in range(N) if _norm_at(res, run, fault.step, r) is not None
              and math.isfinite(_norm_at(res, run, fault.step, r))]
    if 0 < len(took) < N or 0 < len(finite) < N:
        split = (f"rank(s) {', '.join(map(str, sorted(set(range(N)) - set(took))))} left their optimizer's state as it "
                 f"was and rank(s) {', '.join(map(str, took))} updated theirs" if 0 < len(took) < N else
                 f"rank(s) {', '.join(map(str, finite))} reported a finite norm and the others did not")
        return (f"a rank-local skip: at step {fault.step} {split}. The fault was written into rank {fault.rank}'s "
                f"gradient and, after the reduce-scatter, lies in one rank's shard: the others see it only through "
                f"what every rank shares. Decide the skip from the all-reduced norm (not finite on every rank when any "
                f"rank's squares are not), or from a flag all-reduced over every rank")
    if run == "probe" and not any((run_of(res[r], "main").get("skips") or {}).get(f.step) for r in range(N)
                                  for f in FAULTS):
        return ("the skip follows the step's number, not the gradients: in the second run the fault comes at step "
                f"{fault.step}. Decide from the norm (or a flag) of each step's own gradients")
    if run == "main" and fault is FAULTS[1] and len(finite) == N:
        return _COPY_UNSEEN
    if fault.value == float("inf") and not finite and _all_skipped(res, "main", FAULTS[0].step):
        return ("every rank found the norm inf and took the step anyway, though the NaN step was skipped: "
                "torch.isnan misses an inf. Skip when the norm is not finite (torch.isfinite, math.isfinite)")
    return (f"no rank skipped step {fault.step}: its inf or NaN went into the update. Skip every update (and Adam's "
            f"step count) when the global norm is not finite")


def _norm_at(res, run, step, rank):
    norms = run_of(res[rank], run).get("norms") or []
    got = norms[step - 1] if step - 1 < len(norms) else None
    return got if isinstance(got, float) else None


def _all_skipped(res, run, step) -> bool:
    found = [(run_of(res[r], run).get("skips") or {}).get(step) for r in range(N)]
    return all(c is not None and not c for c in found)


def diagnose_communication(rank, by_kind) -> str:
    """Name what carried more than a few scalars, from the bytes of each kind of collective."""
    reduced = by_kind.get("all_reduce", (0, 0))[1]
    if reduced > BOOKKEEPING_BYTES:
        name = sized_like(reduced, {
            "the whole gradient all-reduced over the data-parallel group at each step (a reduce-scatter carries "
            "half of it, all that ZeRO-2 needs)": STEPS_IN_ALL * REDUCTION,
            "the whole gradient all-reduced over every rank at each step":
                STEPS_IN_ALL * 2 * (N - 1) * F64 * PSI_RANK // N,
            "the gradient shard all-reduced over the tensor-parallel pair at each step":
                STEPS_IN_ALL * 2 * (T - 1) * F64 * SHARD // T})
        return (f"rank {rank}'s all-reduces carried {reduced:,} bytes" + (f", the size of {name}" if name else "")
                + ": the norm needs one number from each rank, its sum of squares")
    gathered = sum(b for kind, (_, b) in by_kind.items() if kind.startswith("all_gather"))
    if gathered > STEPS_IN_ALL * REDUCTION // 2 + BOOKKEEPING_BYTES:
        return (f"rank {rank}'s all-gathers carried {gathered:,} bytes, more than the weights' all-gather at every "
                f"step ({STEPS_IN_ALL} x {REDUCTION // 2:,}): were gradients gathered for the norm? One number from "
                f"each rank, its sum of squares, is all the norm needs")
    return ""


def diagnose_state(rank, held, kept) -> str:
    """Name what the optimizer keeps beyond its shard's master, m and v, from the tensors it holds (its attributes,
    read after the first run): sizes alone cannot tell replicated m and v (2·8·Ψ_r) from a fourth shard-sized
    float64 vector beside master, m and v (4·8·Ψ_r/D: the same bytes, with D = 2)."""
    kept = [k for k in (kept or []) if isinstance(k, (list, tuple)) and len(k) == 3]
    if not kept:
        return ""
    sizes = {p.numel() for p in lay.rank_params(lay.init_params(0), rank)}
    whole = [path for path, numel, _ in kept if numel in sizes and numel != SHARD]
    shown = ", ".join(f"{path} ({numel:,} {dtype})" for path, numel, dtype in kept[:6])
    if whole and sum(numel for _, numel, _ in kept) >= 2 * PSI_RANK:
        return (f"rank {rank}'s optimizer keeps state the size of every parameter of the rank ({shown}): Adam is "
                f"replicated over the data-parallel pair. Keep master, m and v for the rank's 1/{D} shard only "
                f"(ZeRO-2)")
    return (f"rank {rank}'s optimizer keeps {shown}{', ...' if len(kept) > 6 else ''}: master, m and v of the "
            f"shard are {3 * F64 * SHARD:,} bytes; the rest is what goes over (a float64 mask or weight per element, "
            f"where a bool mask costs a byte and Python ranges nothing? a gradient kept between steps?)")


def pairs_of(weights):
    return weights if isinstance(weights, list) else []
