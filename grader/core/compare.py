"""Comparing what an answer computed with the serial reference, and saying exactly where they differ."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .result import Budget, Check, fmt

REL_TOL = 1e-8
TOLERANCE_TEXT = "float64, tolerance 1e-8 x max(1, largest |expected|)"


def tensor_mismatch(got, expected: torch.Tensor) -> str | None:
    """None when `got` equals `expected` within tolerance; else what is wrong and where, in one line."""
    if got is None:
        return "is missing (None)"
    if not isinstance(got, torch.Tensor):
        return f"is a {type(got).__name__}, expected a tensor"
    if got.shape != expected.shape:
        return f"has shape {list(got.shape)}, expected {list(expected.shape)}"
    if got.dtype != expected.dtype:
        return f"has dtype {got.dtype}, expected {expected.dtype}"
    got, expected = got.detach(), expected.detach()
    if not torch.isfinite(got).all():
        bad = (~torch.isfinite(got)).nonzero()[0].tolist()
        return f"has a non-finite value {got[tuple(bad)].item()} at {bad}"
    err = (got - expected).abs()
    scale = max(1.0, expected.abs().max().item() if expected.numel() else 1.0)
    worst = err.max().item() if err.numel() else 0.0
    if worst <= REL_TOL * scale:
        return None
    index = list(divmod_index(int(err.argmax()), expected.shape))
    where = tuple(index)
    return (f"max abs error {worst:.3g} at {index} (got {got[where].item():.6g}, expected "
            f"{expected[where].item():.6g}); {int((err > REL_TOL * scale).sum())} of {err.numel()} entries off")


def divmod_index(flat: int, shape) -> list[int]:
    index = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return list(reversed(index))


@dataclass
class Mismatch:
    label: str  # "rank 2: layers[3].w1"
    got: object
    expected: torch.Tensor
    problem: str  # what tensor_mismatch said
    meta: object = None  # whatever the spec attached to the pair (say, (rank, layer, which))


def values_check(name: str, pairs, what: str, diagnose=None) -> Check:
    """One check over many (label, got, expected[, meta]) tensors: passes when all match; else lists the first
    few mismatches (the label says rank and tensor) and how many there are. `diagnose(list of Mismatch)` may name
    the likely mistake."""
    bad = []
    for label, got, expected, *meta in pairs:
        problem = tensor_mismatch(got, expected)
        if problem is not None:
            bad.append(Mismatch(label, got, expected, problem, meta[0] if meta else None))
    if not bad:
        return Check(name, True, f"{what} match the serial reference ({len(pairs)} tensors; {TOLERANCE_TEXT})")
    first = bad[0]
    others = [m.label for m in bad[1:4]]
    also = ""
    if others:
        also = f" Also off: {', '.join(others)}" + (f" and {len(bad) - 4} more." if len(bad) > 4 else ".")
    message = (f"{len(bad)} of {len(pairs)} {what} differ from the serial reference. "
               f"First: {first.label} {first.problem}.{also}")
    return Check(name, False, message, diagnosis=safe_diagnosis(diagnose, bad) if diagnose else "")


def safe_diagnosis(diagnose, *args) -> str:
    """A diagnosis is a guess on top of a verdict: if it crashes, the verdict stands and the guess is withheld."""
    try:
        return diagnose(*args) or ""
    except Exception as exc:
        return (f"(the grader could not work out a likely cause: its diagnosis failed with {type(exc).__name__}; "
                f"please report it with the seed. The check's verdict above stands.)")


def budget_check(name: str, measured, budget: Budget, what: str, over_hint: str = "") -> Check:
    """measured <= budget, with both numbers and the formula in the message."""
    ok = measured <= budget.value
    rel = "within" if ok else "over"
    message = f"{what}: {fmt(measured, budget.unit)}, {rel} the budget {budget.describe()}"
    return Check(name, ok, message, measured=measured, budget=budget, diagnosis="" if ok else over_hint)


def ratio(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    """got / expected when got is (nearly) a constant multiple of expected, else None. Never 1: values that differ
    from expected by less than this test resolves (a rounding error, float32 somewhere) are not "1x" anything."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or expected.abs().max() == 0:
        return None
    e, g = expected.detach().double().reshape(-1), got.detach().double().reshape(-1)  # whatever got's dtype
    k = (g @ e / (e @ e)).item()
    tolerance = 1e-6 * max(1.0, e.abs().max().item()) * max(1.0, abs(k))
    if (g - k * e).abs().max().item() <= tolerance and abs(k - 1) > 1e-6:
        return k
    return None
