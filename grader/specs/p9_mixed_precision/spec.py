"""p9 mixed precision: float16 forward and backward, float32 master weights and Adam, dynamic loss scaling.

Four rules, each measured as such: the master weights after every step against torch.optim.Adam driven by
GradScaler's loss scaling (written out, bit for bit GradScaler's) on the same float16 forward and backward, at a
tolerance measured, not guessed (serial.py); the overflowing step changes nothing the optimizer
keeps (common/optimizer_state.py walks the learner's object, whatever its style); the loss scale after every step; and the
parameter bytes, read off the ledger at a moment the puzzle defines (right after the first step(), no activation
alive, the float16 gradients still in w.grad), against the textbook 2 + 2 + 4 + 4 + 4 = 16 bytes per weight, in both
directions. Before the
first step the program asks scale() what it makes of a loss of 1: a scale() that does not multiply explains every
check that fails after it (no overflow to skip, no scale to halve), and is named first.
"""

from __future__ import annotations

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import CostModel

from ...core import probe
from ...core.compare import safe_diagnosis
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, sized_like
from ...core.spec import Observation, PuzzleSpec
from ..common.optimizer_state import changes, snapshot
from . import serial
from .serial import EXPECTED_SCALES, INIT_SCALE, OVERFLOW_STEP, PSI, close_check, make_inputs

BYTES_PER_WEIGHT = 2 + 2 + 4 + 4 + 4  # float16 weights and gradients, float32 master weights, m and v
PARAMETER_BYTES = BYTES_PER_WEIGHT * PSI
COST = CostModel(latency_ticks=8, bytes_per_tick=512)


def as_number(value):
    """What get_scale() returned, as a float when it is one number (a float, an int, a one-element tensor)."""
    try:
        if isinstance(value, torch.Tensor):
            return float(value.detach().reshape(-1)[0]) if value.numel() == 1 else repr(value)
        return float(value)
    except (TypeError, ValueError):
        return repr(value)


class MixedPrecision(PuzzleSpec):
    id, name, title = "p9", "mixed_precision", "Mixed precision (loss scaling)"
    entries = ("MixedPrecisionAdam",)
    world_size = 1
    cost = COST
    hints = (("Unscale in float32 (w.grad.float() / scale); if any gradient is not finite, only halve the scale "
              "and return; else Adam on the float32 masters, copy them into the float16 weights, count the good "
              "step."),)

    def make_inputs(self, seed):
        return make_inputs(seed)

    def reference(self, inputs):
        batches = serial.probe_batches(inputs["xs"], inputs["targets"])
        probe = {"layers": inputs["layers"], "xs": [x for x, _ in batches], "targets": [t for _, t in batches]}
        serial.torch_reference(probe, overflow_step=serial.PROBE_OVERFLOW)  # (it asserts where the overflow is)
        return serial.torch_reference(inputs)

    def launch(self, inputs):
        return (inputs["layers"], serial.LR, serial.BETAS, serial.EPS, INIT_SCALE, serial.GROWTH_INTERVAL,
                inputs["xs"], inputs["targets"]), None

    def program(self, module):
        optimizer = module.MixedPrecisionAdam

        def run(dist, layers, lr, betas, eps, init_scale, growth_interval, xs, targets):
            masters = {f"layers[{i}].{n}": w for i, pair in enumerate(layers) for n, w in zip(("w1", "w2"), pair)}
            master_bytes = sum(w.untyped_storage().nbytes() for w in masters.values())
            initial = [(w1.detach().clone(), w2.detach().clone()) for w1, w2 in layers]  # for the second run
            before = probe.memory_now()
            opt = optimizer(layers, lr, betas, eps, init_scale, growth_interval)
            out = {"weights": [], "scales": [], "skipped": None, "halves": [serial.half_mismatch(opt.half_layers,
                                                                                                 layers)]}
            with torch.no_grad():  # what scale() makes of a loss of 1, against the scale it says it has
                out["scale_of_one"] = (as_number(opt.scale(torch.ones((), dtype=torch.float32))),
                                       as_number(opt.get_scale()))
            for step, (x, target) in enumerate(zip(xs, targets), 1):
                half = opt.half_layers
                at_forward = probe.memory_now()
                y = forward(x, half)
                if step == 1:
                    out["activation_bytes"] = probe.memory_now() - at_forward
                loss = loss_fn(y.float(), target)
                del y
                opt.scale(loss).backward()
                del loss
                if step == OVERFLOW_STEP:
                    taken = snapshot(opt, masters)
                opt.step()
                if step == 1:
                    out["parameter_bytes"] = probe.memory_now() - before + master_bytes
                if step == OVERFLOW_STEP:
                    out["skipped"] = changes(taken, opt, masters)
                    del taken
                out["halves"].append(serial.half_mismatch(opt.half_layers, layers))
                out["scales"].append(as_number(opt.get_scale()))
                out["weights"].append([(w1.detach().clone(), w2.detach().clone()) for w1, w2 in layers])
                for pair in opt.half_layers:
                    for w in pair:
                        w.grad = None
            del opt
            out["probe"] = second_run(optimizer, initial, lr, betas, eps, init_scale, growth_interval,
                                      serial.probe_batches(xs, targets))
            return out

        return run

    def budgets(self, inputs):
        return {
            "parameter bytes": Budget("parameter bytes", f"16·Ψ + {BOOKKEEPING_BYTES:,} bytes (2 + 2 + 4 + 4 + 4 = "
                                      f"16 bytes per weight: float16 weights and gradients, float32 master "
                                      f"weights, m and v; plus scalars)", PARAMETER_BYTES + BOOKKEEPING_BYTES,
                                      "bytes"),
        }

    def check(self, obs: Observation, ref, inputs):
        res = obs.results[0]
        expected = serial.forced_expectation(inputs, res.get("weights"))
        return [close_check(res.get("weights"), res.get("halves"), expected,
                            lambda step: safe_diagnosis(self.diagnose_weights, res, step, inputs)),
                self.check_skipped(res),
                self.check_scales(res),
                self.check_bytes(res, self.budgets(inputs)["parameter bytes"])]

    def check_skipped(self, res) -> Check:
        changed = res.get("skipped") or []
        second = (res.get("probe") or {}).get("skipped")
        if not changed and (second is None or second):
            what = ("changed " + "; ".join(f"{c['path']} ({c['changed']:,} of {c['numel']:,} entries)"
                                           for c in second[:3])) if second else "did not run"
            return Check("skipped step", False,
                         f"step {OVERFLOW_STEP} was skipped, but in a second run on a fresh optimizer, whose batch "
                         f"{serial.PROBE_OVERFLOW} of {serial.PROBE_STEPS} overflows, step {serial.PROBE_OVERFLOW} "
                         f"{what}",
                         diagnosis=("the skip follows the step's number, not the gradients: find the overflow "
                                    "from the unscaled gradients (torch.isfinite on each), at whatever step it "
                                    "comes") if second else "")
        if not changed:
            return Check("skipped step", True, f"step {OVERFLOW_STEP} (gradients overflowed) changed none of the "
                         f"master weights and none of the tensors your optimizer keeps (read before and after its "
                         f"step())")
        shown = "; ".join(f"{c['path']} ({c['what']}): {c['changed']:,} of {c['numel']:,} entries changed"
                          for c in changed[:4])
        more = f"; and {len(changed) - 4} more" if len(changed) > 4 else ""
        message = (f"step {OVERFLOW_STEP}, whose float16 gradients overflowed, changed what a skipped step must leave "
                   f"as it was: {shown}{more}")
        return Check("skipped step", False, message, diagnosis=safe_diagnosis(self.diagnose_skipped, changed, res))

    @staticmethod
    def diagnose_skipped(changed, res=None) -> str:
        unscaled = scale_not_applied(res)
        if unscaled:
            return unscaled
        paths = [c["path"] for c in changed]
        if any(p.startswith("layers[") for p in paths):
            return (f"the master weights changed in step {OVERFLOW_STEP}: its unscaled gradients hold inf or NaN, so "
                    f"the step must be skipped (check torch.isfinite on every unscaled gradient, and return before "
                    f"the update); only the scale and the count of good steps change")
        return ("the master weights stayed, but other state changed in the skipped step (Adam's m and v, or a "
                "buffer you keep): a skipped step returns before touching anything but the scale and the count "
                "of good steps")

    @staticmethod
    def check_scales(res) -> Check:
        got = list(res.get("scales") or [])
        expected = list(EXPECTED_SCALES)
        ok = got == expected
        shown, wanted = scales_text(got), scales_text(expected)
        second = list((res.get("probe") or {}).get("scales") or [])
        if ok and second != serial.PROBE_SCALES:
            return Check("loss scale", False,
                         f"get_scale() after each step: {shown}, as expected; but in a second run on a fresh "
                         f"optimizer, whose batch {serial.PROBE_OVERFLOW} of {serial.PROBE_STEPS} overflows: "
                         f"{scales_text(second) or 'nothing'}; expected {scales_text(serial.PROBE_SCALES)}",
                         diagnosis="the scale follows the step's number, not the overflow: halve it when the "
                                   "unscaled gradients hold inf or NaN, at whatever step that comes")
        if ok:
            return Check("loss scale", True, f"get_scale() after each step: {shown}, as torch.amp.GradScaler "
                         f"gives (x2 after 2 good steps in a row, /2 at the overflow of step {OVERFLOW_STEP})")
        first = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), min(len(got), len(expected)))
        message = (f"get_scale() after each step: {shown or 'nothing'}; expected {wanted} (GradScaler: start at "
                   f"{INIT_SCALE:,.0f}, x2 after {serial.GROWTH_INTERVAL} good steps in a row, /2 at an overflow). "
                   f"First difference after step {first + 1}")
        return Check("loss scale", False, message,
                     diagnosis=scale_not_applied(res) or safe_diagnosis(diagnose_scales, got, expected, first))

    @staticmethod
    def check_bytes(res, budget: Budget) -> Check:
        held = res.get("parameter_bytes", 0)
        least = PARAMETER_BYTES
        ok = least <= held <= budget.value
        relation = "within" if ok else ("below" if held < least else "over")
        message = (f"right after the first step() your code held {fmt(held, 'bytes')} for the parameters, "
                   f"{held / PSI:.3g} bytes per weight (Ψ = {PSI:,}): {relation} the budget {budget.describe()}, "
                   f"at least 16·Ψ = {least:,}. "
                   f"The activations of the first forward, at its end: {fmt(res.get('activation_bytes', 0), 'bytes')}"
                   f" (measured apart, not counted)")
        diagnosis = "" if ok else safe_diagnosis(diagnose_bytes, held)
        return Check("parameter bytes", ok, message, measured=held, budget=budget, diagnosis=diagnosis)

    def diagnose_weights(self, res, step, inputs) -> str:
        """Name the mistake from the step whose weights first differ, by replaying the common ones."""
        unscaled = scale_not_applied(res)
        if unscaled:
            return unscaled
        weights = res.get("weights") or []
        got = weights[step - 1] if step - 1 < len(weights) else None
        if serial.non_finite(got):
            if step == OVERFLOW_STEP:
                return (f"the weights became inf or NaN at step {OVERFLOW_STEP}, the step whose gradients overflowed: "
                        f"skip a step whose unscaled gradients are not all finite")
            return f"the weights became inf or NaN at step {step}"
        forward_masters = [inputs["layers"], *weights[:step - 1]]
        for mistake, knobs in serial.MISTAKES.items():
            if serial.matches(got, serial.replay(inputs, forward_masters, **knobs)[step - 1]):
                return mistake
        return ""


def scale_not_applied(res) -> str:
    """What scale() made of a loss of 1 (read before the first step), when it is not the scale get_scale() gives:
    the loss was not scaled, whatever else the step does."""
    made, scale = (res or {}).get("scale_of_one") or (None, None)
    if not isinstance(made, float) or not isinstance(scale, float) or made == scale:
        return ""
    return (f"scale() does not multiply the loss by the loss scale: scale() of a loss of 1 gave {made:,.6g}, while "
            f"get_scale() is {scale:,.6g}. The gradients are then divided by a scale they never had (the small ones "
            f"lost in float16 on the way), and the overflow of step {OVERFLOW_STEP} never comes: return loss * scale")


def diagnose_scales(got, expected, first) -> str:
    if len(set(got)) == 1:
        return ("the scale never changed: halve it at a step whose gradients overflow, and double it after "
                f"{serial.GROWTH_INTERVAL} good steps in a row")
    if first == OVERFLOW_STEP - 1:
        return f"step {OVERFLOW_STEP} overflowed: the scale after it is half the scale it used"
    if first < min(len(got), len(expected)) and isinstance(got[first], float) and \
            got[first] in (expected[first] / 2, expected[first] * 2):
        return (f"the scale after step {first + 1} is {got[first]:,.0f}, not {expected[first]:,.0f}: count the "
                f"good steps since the last change of scale (an overflow resets the count), and double the "
                f"scale when the count reaches {serial.GROWTH_INTERVAL}")
    return ""


def diagnose_bytes(held) -> str:
    name = sized_like(held - PARAMETER_BYTES, {"a float32 vector of every weight (a gradient copy kept between "
                                               "steps, or a second master copy?)": 4 * PSI,
                                               "the float16 gradients (freed inside step()? leave w.grad to the "
                                               "grader, as torch's optimizer.step() does)": -2 * PSI,
                                               "float16 m and v (keep Adam's moments in float32)": -4 * PSI})
    return f"the difference from 16·Ψ is the size of {name}" if name else ""


SPEC = MixedPrecision()


def scales_text(scales) -> str:
    return ", ".join(f"{s:,.0f}" if isinstance(s, float) else str(s) for s in scales)


def second_run(optimizer, layers, lr, betas, eps, init_scale, growth_interval, batches) -> dict:
    """A fresh optimizer over batches whose overflow comes at step PROBE_OVERFLOW: the scales after each step and
    what the overflowing step changed."""
    masters = {f"layers[{i}].{n}": w for i, pair in enumerate(layers) for n, w in zip(("w1", "w2"), pair)}
    opt = optimizer(layers, lr, betas, eps, init_scale, growth_interval)
    scales, skipped = [], None
    for step, (x, target) in enumerate(batches, 1):
        loss = loss_fn(forward(x, opt.half_layers).float(), target)
        opt.scale(loss).backward()
        del loss
        if step == serial.PROBE_OVERFLOW:
            taken = snapshot(opt, masters)
        opt.step()
        if step == serial.PROBE_OVERFLOW:
            skipped = changes(taken, opt, masters)
            del taken
        scales.append(as_number(opt.get_scale()))
        for pair in opt.half_layers:
            for w in pair:
                w.grad = None
    return {"scales": scales, "skipped": skipped}

