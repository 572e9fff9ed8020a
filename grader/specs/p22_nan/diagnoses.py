"""p22's likely causes, each named only when the evidence singles it out: a nan at the step that holds the
poisoned sample, an inf at the spike step (the loss overflowing float16), a skipped step at one of them, and a
curve that follows the replay of clipping before unscaling rather than the reference."""

from __future__ import annotations

import math

import torch

from . import layout as lay

POISON = ("one sample of this step holds a NaN in its input, on one rank (torch.isfinite(x).all(dim=1) finds it). "
          "Drop that row before the forward (masking its loss is not enough: the gradient x^T·dy is nan·0 = nan), "
          "and average the loss over the clean rows of the whole batch: all-reduce their summed loss and their "
          "count.")
OVERFLOW = (f"this step's targets are large (an outlier shard): a sample's squared error summed over its {lay.D} "
            f"features, about {lay.D} x {lay.SPIKE:.0f}² = {lay.D * lay.SPIKE ** 2:,.0f}, is over float16's largest "
            f"number, 65,504, so a loss computed in float16 is inf whatever the loss scale or the learning rate. "
            f"Compute the loss in float32 (y.float()), as torch.autocast does.")
CLIPPED_SCALED = (f"the loss falls as if every step were clipped to a step {lay.INIT_SCALE:.0f} times too small: the "
                  "gradients were clipped while still multiplied by the loss scale, so the norm measured is the "
                  "scale times too large. Unscale first (grad.float() / scale), then clip.")


def _value(v) -> float | None:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.detach().double())
    return float(v) if isinstance(v, (int, float)) else None


def _follows(got, want, steps) -> bool:
    values = [_value(got[s]) if s < len(got) else None for s in steps]
    return all(v is not None and math.isfinite(v) and abs(v - want[s]) <= lay.LOSS_TOLERANCE * abs(want[s])
               for v, s in zip(values, steps))


def clipped_scaled(losses, inputs) -> bool:
    """Whether the logged losses follow the replay of clipping before unscaling (at the ordinary steps) and not
    the reference."""
    ordinary = [s for s in range(1, lay.STEPS) if s not in (inputs["poison_step"], inputs["spike_step"])]
    replay = lay.reference_run(inputs, clip_scaled=True)["losses"]
    return _follows(losses, replay, ordinary) and not _follows(losses, lay.reference_run(inputs)["losses"], ordinary)


def loss_diagnosis(losses, s: int, inputs) -> str:
    value = _value(losses[s])
    if value is not None and math.isnan(value) and s == inputs["poison_step"]:
        return f"the loss is nan at step {s}: " + POISON
    if value is not None and math.isinf(value) and s == inputs["spike_step"]:
        return f"the loss is inf at step {s}: " + OVERFLOW
    if value is not None and math.isfinite(value) and clipped_scaled(losses, inputs):
        return CLIPPED_SCALED
    return ""


def skipped_diagnosis(s: int, inputs) -> str:
    if s == inputs["poison_step"]:
        return f"at step {s}, " + POISON
    if s == inputs["spike_step"]:
        return f"at step {s}, " + OVERFLOW
    return ""


def weights_diagnosis(r: dict, inputs) -> str:
    losses = r.get("losses") or []
    return CLIPPED_SCALED if len(losses) == lay.STEPS and clipped_scaled(losses, inputs) else ""


def communication_diagnosis(rank: int, by_kind: dict) -> str:
    gathered = [kind for kind in by_kind if "gather" in kind or kind in ("broadcast", "send", "all_to_all")]
    if not gathered:
        return ""
    return (f"rank {rank} sent the batch's data ({', '.join(gathered)}) as well as the gradients: to find a poisoned "
            f"sample, each rank need only test its own rows (torch.isfinite(x).all(dim=1)) and all-reduce the count "
            f"of clean rows, one number.")
