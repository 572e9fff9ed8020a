"""p22 the NaN: a data-parallel float16 run (float32 master weights, a loss scale, gradient clipping) whose loss is
nan at one step and inf at another. Three faults of three kinds sit in the program as handed out: the loss computed
in float16, where the spike step's squared errors overflow (an overflow in the forward); a sample whose input holds
a NaN (a poisoned sample, on a rank, at a step, in a row: the seed's); and the gradients clipped while still
multiplied by the loss scale (clipping before unscaling). The learner finds each with the tools and fixes its cause.

The rules, each measured as such: the loss logged at every step against the float32 reference's (which drops the
poisoned sample and trains on every step), within a relative tolerance that float16 meets; every rank's master
weights after the run against the reference's, within a float16-aware tolerance; every step taken (the harness
reads the masters at each `log` call: a step that changed none was skipped, or its gradients zeroed, which hides
the fault instead of fixing it); and the bytes each rank sends (each step's gradients once).
"""

from __future__ import annotations

import math

import torch

from ...core.compare import divmod_index, safe_diagnosis
from ...core.result import Budget, Check
from ...core.rules import BOOKKEEPING_BYTES, communication_check
from ...core.spec import Observation, PuzzleSpec, pair_at
from puzzles.sim import CostModel
from . import layout as lay
from .diagnoses import communication_diagnosis, loss_diagnosis, skipped_diagnosis, weights_diagnosis

NETWORK = {"latency_ticks": 8, "bytes_per_tick": 512}  # puzzle 8's network


class TheNaN(PuzzleSpec):
    id, name, title = "p22", "nan", "The NaN (an overflow, a poisoned sample, clipping before unscaling)"
    entries = ("train_fp16",)
    world_size = lay.N
    cost = CostModel(**NETWORK)
    hints = ("Print the loss of each sample (loss_fn row by row) at the step whose loss is nan, on each rank: one "
             "row of one rank is nan, the rest finite. At the step whose loss is inf, every row's loss is inf "
             "in float16 and finite in float32.",
             "Drop the rows whose input is not finite before the forward and average over the clean rows of the "
             "whole batch; compute the loss in float32 (y.float()); unscale the gradients before clipping them.")

    def make_inputs(self, seed):
        return lay.make_inputs(seed)

    def reference(self, inputs):
        return lay.reference_run(inputs)

    def launch(self, inputs):
        shared = (inputs["lr"], inputs["max_norm"], inputs["init_scale"])
        per_rank = []
        for r in range(lay.N):
            batches = lay.rank_batches(inputs, r)
            per_rank.append((torch.cat([x for x, _ in batches]), torch.cat([t for _, t in batches]),
                             inputs["layers"]))
        return shared, per_rank

    def program(self, module):
        train = getattr(module, self.entries[0])

        def run(dist, lr, max_norm, init_scale, x, target, layers):
            masters = [(w1.detach().clone(), w2.detach().clone()) for w1, w2 in layers]
            batches = [(x[s * lay.R:(s + 1) * lay.R], target[s * lay.R:(s + 1) * lay.R]) for s in range(lay.STEPS)]
            losses, after = [], []

            def log(loss):
                """The run's logger: the step's loss, and the masters as they are now (the step's update done)."""
                losses.append(loss.detach().clone() if isinstance(loss, torch.Tensor) else loss)
                after.append([(w1.detach().clone(), w2.detach().clone()) for w1, w2 in masters])

            train(dist, batches, masters, lr, max_norm, init_scale, log)
            return {"weights": [(w1.detach().clone(), w2.detach().clone()) for w1, w2 in masters],
                    "losses": losses, "after_each_step": after}

        return run

    def budgets(self, inputs):
        return {"communication": Budget(
            "communication", f"S·2(N-1)/N·G + {BOOKKEEPING_BYTES:,} bytes: S = {lay.STEPS} steps, each one "
            f"all-reduce of the float32 gradients (G = 4·Ψ = {lay.GRADIENT_BYTES:,} bytes); 1 KiB for scalars such "
            f"as the count of clean rows", lay.STEPS * lay.ALL_REDUCE_BYTES + BOOKKEEPING_BYTES, "bytes")}

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        res = [r if isinstance(r, dict) else {} for r in obs.results]
        return [self.check_losses(res, ref, inputs), self.check_weights(res, ref, inputs),
                self.check_steps(res, inputs),
                communication_check(obs, self.budgets(inputs)["communication"], diagnose=communication_diagnosis)]

    def check_losses(self, res, ref, inputs) -> Check:
        name = "loss curve"
        want = ref["losses"]
        for rank, r in enumerate(res):
            got = r.get("losses") or []
            if len(got) != lay.STEPS:
                return Check(name, False, f"rank {rank} logged {len(got)} losses, one per step expected "
                             f"({lay.STEPS}): call log(loss) once a step, after its update.")
            values = [_number(g) for g in got]
            for s, (g, value) in enumerate(zip(got, values)):
                if value is None:
                    return Check(name, False, f"rank {rank}'s loss at step {s} is a {type(g).__name__}, expected a "
                                 f"tensor of one number")
            # the first non-finite loss first (the symptom in the log), then the first one off the curve
            off = [s for s, v in enumerate(values) if not math.isfinite(v)] or \
                  [s for s, v in enumerate(values) if abs(v - want[s]) > lay.LOSS_TOLERANCE * abs(want[s])]
            if off:
                s = off[0]
                return Check(name, False, f"rank {rank} logged loss {values[s]:.6g} at step {s}, the float32 "
                             f"reference {want[s]:.6g} (it drops the poisoned sample and trains on every step; "
                             f"tolerance {lay.LOSS_TOLERANCE:.1%} relative). Losses logged: {_curve(got)}; the "
                             f"reference's: {_curve(want)}.", diagnosis=safe_diagnosis(loss_diagnosis, got, s, inputs))
        return Check(name, True, f"every rank's loss at each of the {lay.STEPS} steps is within "
                                 f"{lay.LOSS_TOLERANCE:.1%} of the float32 reference's")

    def check_weights(self, res, ref, inputs) -> Check:
        name = "weights"
        for rank, r in enumerate(res):
            got = r.get("weights") or []
            for i, want in enumerate(ref["weights"]):
                for k, (g, e) in enumerate(zip(pair_at(got, i), want)):
                    problem = _mismatch(g, e)
                    if problem is not None:
                        return Check(name, False, f"rank {rank}'s master layers[{i}].{('w1', 'w2')[k]} after the "
                                     f"{lay.STEPS} steps {problem} (the float32 reference: clean rows, every step, "
                                     f"clipped to {lay.MAX_NORM}, SGD lr {lay.LR}; tolerance "
                                     f"{lay.WEIGHT_TOLERANCE} x max(1, largest |expected|)).",
                                     diagnosis=safe_diagnosis(weights_diagnosis, r, inputs))
        return Check(name, True, f"every rank's float32 master weights after the {lay.STEPS} steps are within "
                                 f"{lay.WEIGHT_TOLERANCE} x max(1, largest |expected|) of the float32 reference's")

    def check_steps(self, res, inputs) -> Check:
        name = "every step taken"
        for rank, r in enumerate(res):
            after = r.get("after_each_step") or []
            before = inputs["layers"]
            for s, now in enumerate(after[:lay.STEPS]):
                if _same(now, before):
                    return Check(name, False, f"step {s} changed none of rank {rank}'s master weights: it was "
                                 f"skipped, or its gradients were zeroed. That is a workaround, not a fix: the step's "
                                 f"{lay.B - 1} good samples are thrown away with whatever made it non-finite, and the "
                                 f"cause stays. Find what made the step's loss or gradients non-finite and fix "
                                 f"that; with the causes fixed the loss scaler never skips.",
                                 diagnosis=safe_diagnosis(skipped_diagnosis, s, inputs))
                before = now
        return Check(name, True, f"each of the {lay.STEPS} steps changed the master weights on every rank (none "
                                 f"skipped, none zeroed)")


def _number(value):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().double())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _curve(values) -> str:
    shown = [_number(v) for v in values]
    return ", ".join("?" if v is None else f"{v:.4g}" for v in shown)


def _same(now, before) -> bool:
    """Whether the masters logged at a step are, bit for bit, those before it."""
    try:
        return all(torch.equal(g, e) for i, want in enumerate(before) for g, e in zip(pair_at(now, i), want))
    except (TypeError, RuntimeError):
        return False


def _mismatch(got, expected: torch.Tensor) -> str | None:
    """None when `got` is a float32 tensor within WEIGHT_TOLERANCE of `expected`; else what is wrong and where."""
    if not isinstance(got, torch.Tensor):
        return "is missing (None)" if got is None else f"is a {type(got).__name__}, expected a tensor"
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return f"is {got.dtype}{list(got.shape)}, expected {expected.dtype}{list(expected.shape)}"
    if not torch.isfinite(got).all():
        bad = (~torch.isfinite(got)).nonzero()[0].tolist()
        return f"has a non-finite value {got[tuple(bad)].item()} at {bad}"
    err = (got.double() - expected.double()).abs()
    limit = lay.WEIGHT_TOLERANCE * max(1.0, expected.abs().max().item())
    if err.max().item() <= limit:
        return None
    where = divmod_index(int(err.argmax()), expected.shape)
    return (f"is off by up to {err.max().item():.3g} at {where} (got {got[tuple(where)].item():.6g}, expected "
            f"{expected[tuple(where)].item():.6g}); {int((err > limit).sum())} of {err.numel()} entries off")


SPEC = TheNaN()
