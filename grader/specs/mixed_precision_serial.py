"""p9's serial truth: its sizes, its inputs, torch's own mixed-precision step as the reference, a hand-written one
that replays the common mistakes, and the comparison at a measured tolerance.

Why a tolerance and not float64's 1e-8: Adam's float32 arithmetic written another way rounds differently in the
last bit, and now and then that moves a float16 copy of a weight across a rounding boundary, which changes the next
forward a little. `replay()` below is such another way (m·lr/(1-beta1^t) / (sqrt(v/(1-beta2^t)) + eps), where
torch.optim.Adam divides sqrt(v) by sqrt(1-beta2^t)): over 300 seeds it differs from the reference by at most
2.2e-6 (bench/bench_mixed_precision.py), while the closest mistake is off by about 1e-4: TOLERANCE sits between.
"""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch

from ..core.compare import divmod_index
from ..core.result import Check

L, D, H, B, K_STEPS = 2, 32, 64, 32, 6
PSI = 2 * L * D * H  # weights
LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8
INIT_SCALE, GROWTH_INTERVAL, GROWTH, BACKOFF = 1024.0, 2, 2.0, 0.5
OVERFLOW_STEP = 4  # 1-based: the step whose batch makes the scaled float16 gradients overflow
OVERFLOW_TARGET = 1e4  # that batch's targets are this many times larger
TOLERANCE = 2e-5  # x max(1, largest |expected|): see the module docstring
TOLERANCE_TEXT = f"float32 master weights, tolerance {TOLERANCE:g} x max(1, largest |expected|)"


def scales_after_each_step(overflows) -> list[float]:
    """torch.amp.GradScaler's scale after each step (its update(): x GROWTH after GROWTH_INTERVAL good steps in
    a row, x BACKOFF at an overflow, which also restarts the count)."""
    scale, good, out = INIT_SCALE, 0, []
    for overflow in overflows:
        if overflow:
            scale, good = scale * BACKOFF, 0
        else:
            good += 1
            if good == GROWTH_INTERVAL:
                scale, good = scale * GROWTH, 0
        out.append(scale)
    return out


EXPECTED_SCALES = scales_after_each_step([step == OVERFLOW_STEP for step in range(1, K_STEPS + 1)])


def make_inputs(seed: int) -> dict:
    x, target = make_batch(B * K_STEPS, D, seed)
    targets = [t.float() for t in target.chunk(K_STEPS)]
    targets[OVERFLOW_STEP - 1] = targets[OVERFLOW_STEP - 1] * OVERFLOW_TARGET
    layers = [(w1.float(), w2.float()) for w1, w2 in init_layers(L, D, H, seed + 1, requires_grad=False)]
    return {"layers": layers, "xs": [c.half() for c in x.chunk(K_STEPS)], "targets": targets}


def _half_copies(weights):
    return [w.detach().half().requires_grad_() for w in weights]


def _pairs(flat):
    return list(zip(flat[::2], flat[1::2]))


def torch_reference(inputs) -> dict:
    """torch.optim.Adam on the float32 masters, torch.amp.GradScaler deciding each step, on float16 copies: the
    master weights after each step, the scales, and which steps overflowed."""
    masters = [w.detach().clone().requires_grad_() for pair in inputs["layers"] for w in pair]
    adam = torch.optim.Adam(masters, lr=LR, betas=BETAS, eps=EPS, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_factor=GROWTH, backoff_factor=BACKOFF,
                                  growth_interval=GROWTH_INTERVAL)
    weights, scales, overflows = [], [], []
    for x, target in zip(inputs["xs"], inputs["targets"]):
        half = _half_copies(masters)
        loss = loss_fn(forward(x, _pairs(half)).float(), target)
        scaler.scale(loss).backward()
        for m, h in zip(masters, half):
            m.grad = h.grad.float()
        scaler.unscale_(adam)
        overflows.append(not all(torch.isfinite(m.grad).all() for m in masters))
        scaler.step(adam)
        scaler.update()
        adam.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
        weights.append([(w1.detach().clone(), w2.detach().clone()) for w1, w2 in _pairs(masters)])
    expected = [step == OVERFLOW_STEP for step in range(1, K_STEPS + 1)]
    if overflows != expected:  # the inputs are built to make exactly that step overflow, whatever the seed
        raise AssertionError(f"p9's inputs overflowed at steps {overflows}, not only at step {OVERFLOW_STEP}")
    return {"weights": weights, "scales": scales, "overflows": overflows}


def replay(inputs, unscale=True, count_skipped=False, copy_back=True, bias_correction=True,
           nan_to_num=False, decay_on_skip=False, master_from_half=False) -> list:
    """The master weights after each step, written by hand, with knobs that make the common mistakes."""
    masters = [w.detach().clone() for pair in inputs["layers"] for w in pair]
    half = _half_copies(masters)
    m = [torch.zeros_like(w) for w in masters]
    v = [torch.zeros_like(w) for w in masters]
    (beta1, beta2), scale, good, t, weights = BETAS, INIT_SCALE, 0, 0, []
    for x, target in zip(inputs["xs"], inputs["targets"]):
        (loss_fn(forward(x, _pairs(half)).float(), target) * scale).backward()
        with torch.no_grad():
            grads = [h.grad.float() / (scale if unscale else 1.0) for h in half]
            finite = all(torch.isfinite(g).all() for g in grads)
            if nan_to_num:
                grads = [torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0) for g in grads]
            if finite or count_skipped or nan_to_num:
                t += 1
            if finite or nan_to_num:
                bc1, bc2 = (1 - beta1 ** t, 1 - beta2 ** t) if bias_correction else (1.0, 1.0)
                for w, g, mi, vi, h in zip(masters, grads, m, v, half):
                    if master_from_half:
                        w.copy_(h)
                    mi.mul_(beta1).add_(g, alpha=1 - beta1)
                    vi.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    w.addcdiv_(mi, (vi / bc2).sqrt() + EPS, value=-LR / bc1)
                    if copy_back:
                        h.copy_(w)
            if not finite and decay_on_skip:  # m and v updated as if the gradient were zero; no update
                for mi, vi in zip(m, v):
                    mi.mul_(beta1)
                    vi.mul_(beta2)
            if finite:
                good += 1
                if good == GROWTH_INTERVAL:
                    scale, good = scale * GROWTH, 0
            else:
                scale, good = scale * BACKOFF, 0
            for h in half:
                h.grad = None
        weights.append([(w1.clone(), w2.clone()) for w1, w2 in _pairs(masters)])
    return weights


MISTAKES = {  # the likely cause each replay names, when the answer matches it (and not the reference)
    f"Adam's step count t counted the skipped step {OVERFLOW_STEP}: GradScaler does not call optimizer.step() "
    f"for a step whose gradients overflowed, so torch.optim.Adam's state['step'] stays; count only the steps "
    f"taken": {"count_skipped": True},
    "the gradients were not unscaled (divide them by the loss scale, in float32, before Adam): Adam hardly "
    "notices a constant factor, but the scale changes from step to step": {"unscale": False},
    "the float16 weights were not updated: copy the master weights into them in place after each update "
    "(h.copy_(w) under no_grad)": {"copy_back": False},
    "the bias correction is missing: divide m by 1 - beta1^t and v by 1 - beta2^t, as torch.optim.Adam does":
        {"bias_correction": False},
    f"the non-finite gradients of step {OVERFLOW_STEP} were zeroed and the step taken anyway: skip it instead":
        {"nan_to_num": True},
    "the master weights were overwritten from the float16 weights before the update, so every update starts "
    "from a weight rounded to float16: keep the float32 master copy as it is, and copy it into the float16 "
    "weights (not the other way)": {"master_from_half": True},
    f"Adam's m and v were decayed in the skipped step {OVERFLOW_STEP} (m·beta1, v·beta2, as if its gradient were "
    f"zero): a skipped step leaves them as they were": {"decay_on_skip": True},
}


def non_finite(weights) -> bool:
    return any(isinstance(w, torch.Tensor) and w.is_floating_point() and not torch.isfinite(w).all()
               for pair in (weights or []) if isinstance(pair, (list, tuple)) for w in pair)


def mismatch(got, expected: torch.Tensor) -> str | None:
    """None when `got` is a float32 tensor within TOLERANCE of `expected`; else what is wrong and where."""
    if not isinstance(got, torch.Tensor):
        return "is missing (None)" if got is None else f"is a {type(got).__name__}, expected a tensor"
    if got.shape != expected.shape:
        return f"has shape {list(got.shape)}, expected {list(expected.shape)}"
    if got.dtype != expected.dtype:
        return f"has dtype {got.dtype}, expected {expected.dtype}"
    if not torch.isfinite(got).all():
        bad = (~torch.isfinite(got)).nonzero()[0].tolist()
        return f"has a non-finite value {got[tuple(bad)].item()} at {bad}"
    err = (got.double() - expected.double()).abs()
    limit = TOLERANCE * max(1.0, expected.abs().max().item())
    worst = err.max().item()
    if worst <= limit:
        return None
    where = divmod_index(int(err.argmax()), expected.shape)
    return (f"max abs error {worst:.3g} at {where} (got {got[tuple(where)].item():.6g}, expected "
            f"{expected[tuple(where)].item():.6g}); {int((err > limit).sum())} of {err.numel()} entries off")


def step_mismatches(got_step, expected_step) -> list[tuple[str, str]]:
    out = []
    for i, (e1, e2) in enumerate(expected_step):
        pair = got_step[i] if isinstance(got_step, (list, tuple)) and i < len(got_step) else (None, None)
        pair = pair if isinstance(pair, (list, tuple)) and len(pair) == 2 else (None, None)
        for name, g, e in (("w1", pair[0], e1), ("w2", pair[1], e2)):
            problem = mismatch(g, e)
            if problem:
                out.append((f"layers[{i}].{name}", problem))
    return out


def matches(got_step, expected_step) -> bool:
    return got_step is not None and not step_mismatches(got_step, expected_step)


def close_check(weights, ref, diagnose) -> Check:
    """The master weights after every step against the reference's, at TOLERANCE; the message names the first
    step that differs (and which steps before it matched). `diagnose(step)` may name the mistake."""
    name = "weights after each step"
    weights = weights if isinstance(weights, list) else []
    for step, expected in enumerate(ref["weights"], 1):
        got = weights[step - 1] if step - 1 < len(weights) else None
        bad = step_mismatches(got, expected) if got is not None else [("the weights", "were not recorded")]
        if bad:
            label, problem = bad[0]
            others = ", ".join(lbl for lbl, _ in bad[1:4])
            before = f"steps 1 to {step - 1} matched; " if step > 1 else ""
            message = (f"the master weights after step {step} of {len(ref['weights'])} differ from the reference "
                       f"({before}{TOLERANCE_TEXT}). First: {label} {problem}."
                       + (f" Also off: {others}." if others else ""))
            return Check(name, False, message, diagnosis=diagnose(step))
    return Check(name, True, f"the master weights after each of the {len(ref['weights'])} steps match torch's "
                             f"GradScaler and Adam ({TOLERANCE_TEXT})")
