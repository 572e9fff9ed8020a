"""p9's serial truth: its sizes, its inputs, torch's own mixed-precision step as the reference, a hand-written one
that replays the common mistakes, and the comparison at a measured tolerance.

Why a tolerance and not float64's 1e-8 relative, and why teacher forcing. Adam's float32 arithmetic written
another way (`replay()` below divides sqrt(v/(1-beta2^t)) where torch.optim.Adam divides sqrt(v) by
sqrt(1-beta2^t)) rounds differently in the last bit; now and then that moves a float16 copy of a weight across a
rounding boundary, the next forward changes a little, and Adam, which divides by sqrt(v), can turn a small change
of a small gradient into a visible change of its update. Run on their own, two correct answers drift apart:
measured over 1,000 seeds, by up to 1.15e-5, a heavy tail, while the closest mistake (counting the skipped step
in Adam's t) is 1.04e-4 away at its closest. So the grader runs the reference forced onto the answer's own master
weights (`forced_expectation`: each step's forward on the float16 copies of the answer's masters after the step
before), which judges each step on the gradients the answer itself computed: correct answers then stay within
6e-8 (1,000 seeds; one float32 ulp at 0.5), every replayed mistake at least 1.04e-4 away, and TOLERANCE = 1e-6
sits between, with a factor of 16 on one side and 100 on the other (bench/bench_part_two.py). That the float16
copies are the masters rounded is checked apart, bit for bit.
"""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch

from ...core.compare import divmod_index
from ...core.result import Check

L, D, H, B, K_STEPS = 2, 32, 64, 32, 6
PSI = 2 * L * D * H  # weights
LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8
INIT_SCALE, GROWTH_INTERVAL, GROWTH, BACKOFF = 1024.0, 2, 2.0, 0.5
OVERFLOW_STEP = 4  # 1-based: the step whose batch makes the scaled float16 gradients overflow
OVERFLOW_TARGET = 1e4  # that batch's targets are this many times larger
TOLERANCE = 1e-6  # x max(1, largest |expected|), after each step, teacher-forced: see the module docstring
TOLERANCE_TEXT = f"float32 master weights, tolerance {TOLERANCE:g} x max(1, largest |expected|)"


def next_scale(scale: float, good: int, overflow: bool) -> tuple[float, int]:
    """torch.amp.GradScaler's update(): the scale and the count of good steps in a row after one step (x GROWTH
    after GROWTH_INTERVAL good steps in a row, x BACKOFF at an overflow, which also restarts the count)."""
    if overflow:
        return scale * BACKOFF, 0
    good += 1
    return (scale * GROWTH, 0) if good == GROWTH_INTERVAL else (scale, good)


def scales_after_each_step(overflows) -> list[float]:
    """The scale after each step, from INIT_SCALE."""
    scale, good, out = INIT_SCALE, 0, []
    for overflow in overflows:
        scale, good = next_scale(scale, good, overflow)
        out.append(scale)
    return out


EXPECTED_SCALES = scales_after_each_step([step == OVERFLOW_STEP for step in range(1, K_STEPS + 1)])

# A second, shorter run on a fresh optimizer, whose overflow comes at another step: a skip or a scale tied to the
# step's number (the text's step 4) instead of to the gradients fails it.
PROBE_STEPS, PROBE_OVERFLOW = 3, 2
PROBE_SCALES = scales_after_each_step([step == PROBE_OVERFLOW for step in range(1, PROBE_STEPS + 1)])


def probe_batches(xs, targets) -> list:
    """The second run's batches: the first PROBE_STEPS of the run's, the PROBE_OVERFLOW-th made to overflow."""
    return [(x, t * OVERFLOW_TARGET if step == PROBE_OVERFLOW else t)
            for step, (x, t) in enumerate(zip(xs[:PROBE_STEPS], targets[:PROBE_STEPS]), 1)]


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


def _steps(inputs, forward_masters):
    """(step's batch, the float32 weights its forward's float16 copies are rounded from, or None for the run's own)."""
    batches = list(zip(inputs["xs"], inputs["targets"]))
    if forward_masters is None:
        return [(x, t, None) for x, t in batches]
    return [(x, t, [w for pair in fm for w in pair]) for (x, t), fm in zip(batches, forward_masters)]


def torch_reference(inputs, forward_masters=None, overflow_step=OVERFLOW_STEP) -> dict:
    """torch.optim.Adam on the float32 masters, GradScaler's dynamic loss scaling deciding each step, on float16
    copies: the master weights after each step, the scales, and which steps overflowed.

    The scaler is GradScaler's CPU path written out (scale the loss, multiply the gradients by the inverse scale,
    skip optimizer.step() when any is not finite, next_scale), not torch.amp.GradScaler itself: that came in torch
    2.3, and on a CPU torch.cuda.amp's disables itself, so torch 2.2 could not grade p9 at all. Every scale is a
    power of two, so scaling and unscaling are exact and the result is GradScaler's bit for bit
    (tests/test_p9_mixed_precision.py holds it to torch.amp.GradScaler wherever torch has one).

    `forward_masters[s]` (teacher forcing): the float32 weights whose float16 copies step s+1's forward runs on,
    instead of the reference's own masters. The grader passes an answer's own masters (the initial ones, then
    those after each step), so that a last-bit difference in an earlier update, which can move a float16 copy
    across a rounding boundary, is not carried into the next step's gradients: each step is then compared on the
    gradients the answer itself computed."""
    masters = [w.detach().clone().requires_grad_() for pair in inputs["layers"] for w in pair]
    adam = torch.optim.Adam(masters, lr=LR, betas=BETAS, eps=EPS, foreach=False)
    scale, good = INIT_SCALE, 0
    weights, scales, overflows = [], [], []
    for x, target, forced in _steps(inputs, forward_masters):
        half = _half_copies(masters if forced is None else forced)
        loss = loss_fn(forward(x, _pairs(half)).float(), target)
        (loss * scale).backward()
        inverse = torch.tensor(scale, dtype=torch.float64).reciprocal().float()  # as GradScaler.unscale_
        for m, h in zip(masters, half):
            m.grad = h.grad.float() * inverse
        overflow = not all(torch.isfinite(m.grad).all() for m in masters)
        if not overflow:
            adam.step()
        scale, good = next_scale(scale, good, overflow)
        overflows.append(overflow)
        adam.zero_grad(set_to_none=True)
        scales.append(scale)
        weights.append([(w1.detach().clone(), w2.detach().clone()) for w1, w2 in _pairs(masters)])
    expected = [step == overflow_step for step in range(1, len(overflows) + 1)]
    if forward_masters is None and overflows != expected:  # the inputs make exactly that step overflow, any seed
        raise AssertionError(f"p9's inputs overflowed at steps {overflows}, not only at step {overflow_step}")
    return {"weights": weights, "scales": scales, "overflows": overflows}


def replay(inputs, forward_masters=None, unscale=True, count_skipped=False, bias_correction=True,
           nan_to_num=False, decay_on_skip=False, master_from_half=False) -> list:
    """The master weights after each step, written by hand (another order of Adam's float32 arithmetic than
    torch.optim.Adam's), with knobs that make the common mistakes; `forward_masters` as in torch_reference."""
    masters = [w.detach().clone() for pair in inputs["layers"] for w in pair]
    m = [torch.zeros_like(w) for w in masters]
    v = [torch.zeros_like(w) for w in masters]
    (beta1, beta2), scale, good, t, weights = BETAS, INIT_SCALE, 0, 0, []
    for x, target, forced in _steps(inputs, forward_masters):
        half = _half_copies(masters if forced is None else forced)
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
            if not finite and decay_on_skip:  # m and v updated as if the gradient were zero; no update
                for mi, vi in zip(m, v):
                    mi.mul_(beta1)
                    vi.mul_(beta2)
            scale, good = next_scale(scale, good, not finite)
        weights.append([(w1.clone(), w2.clone()) for w1, w2 in _pairs(masters)])
    return weights


MISTAKES = {  # the likely cause each replay names, when the answer matches it (and not the reference)
    f"Adam's step count t counted the skipped step {OVERFLOW_STEP}: GradScaler does not call optimizer.step() "
    f"for a step whose gradients overflowed, so torch.optim.Adam's state['step'] stays; count only the steps "
    f"taken": {"count_skipped": True},
    "the gradients were not unscaled (divide them by the loss scale, in float32, before Adam): Adam hardly "
    "notices a constant factor, but the scale changes from step to step": {"unscale": False},
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


def half_mismatch(half_layers, masters) -> str | None:
    """Run on the rank: None when every float16 weight is its master weight rounded to float16, bit for bit;
    else where it is not (the first weight that differs, and how many of its entries)."""
    try:
        pairs = [tuple(pair) for pair in half_layers]
    except TypeError:
        return f"opt.half_layers is a {type(half_layers).__name__}, not a list of (w1, w2) pairs"
    for i, ((m1, m2), pair) in enumerate(zip(masters, pairs)):
        for name, master, half in zip(("w1", "w2"), (m1, m2), pair):
            if not isinstance(half, torch.Tensor) or half.shape != master.shape or half.dtype != torch.float16:
                what = f"{half.dtype}{list(half.shape)}" if isinstance(half, torch.Tensor) else type(half).__name__
                return f"layers[{i}].{name} is {what}, expected float16{list(master.shape)}"
            with torch.no_grad():
                differ = int((half != master.half()).sum())
            if differ:
                return f"layers[{i}].{name}: {differ:,} of {half.numel():,} entries are not its master weight rounded"
    return None


def valid_step(step_weights, like) -> bool:
    """Whether one step's recorded weights are float32 tensors of the masters' shapes (teacher forcing needs it)."""
    return isinstance(step_weights, list) and len(step_weights) == len(like) and all(
        isinstance(g, torch.Tensor) and g.shape == e.shape and g.dtype == e.dtype
        for pair, epair in zip(step_weights, like) for g, e in zip(pair, epair))


def forced_expectation(inputs, weights) -> list:
    """The reference's master weights after each step, each step's forward run on the answer's own masters
    (the initial ones, then the answer's after each step, as far as they are valid)."""
    forward_masters = [inputs["layers"]]
    for step_weights in (weights or [])[:K_STEPS - 1]:
        if not valid_step(step_weights, inputs["layers"]):
            break
        forward_masters.append(step_weights)
    return torch_reference(inputs, forward_masters)["weights"]


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


def close_check(weights, halves, expected, diagnose) -> Check:
    """Step by step: the float16 weights the step's forward ran on are the master weights rounded (bit for bit),
    and the master weights after it are within TOLERANCE of `expected` (forced_expectation). The message names the
    first step that differs (and which steps before it matched). `diagnose(step)` may name the mistake."""
    name = "weights after each step"
    weights = weights if isinstance(weights, list) else []
    halves = halves if isinstance(halves, list) else []
    for step in range(1, len(expected) + 2):
        before = f"steps 1 to {step - 1} matched; " if step > 1 else ""
        made = halves[step - 1] if step - 1 < len(halves) else "they were not recorded"
        if made is not None:
            when = "after __init__" if step == 1 else f"after step {step - 1}"
            return Check(name, False, f"the float16 weights {when} are not the master weights rounded to float16 "
                         f"({before}bit for bit): {made}",
                         diagnosis="make the float16 weights from the masters, and copy the masters into them "
                                   "after every update (h.copy_(w) under no_grad)")
        if step > len(expected):
            break
        got = weights[step - 1] if step - 1 < len(weights) else None
        bad = step_mismatches(got, expected[step - 1]) if got is not None else [("the weights", "were not recorded")]
        if bad:
            label, problem = bad[0]
            others = ", ".join(lbl for lbl, _ in bad[1:4])
            message = (f"the master weights after step {step} of {len(expected)} differ from the reference "
                       f"({before}{TOLERANCE_TEXT}). First: {label} {problem}."
                       + (f" Also off: {others}." if others else ""))
            return Check(name, False, message, diagnosis=diagnose(step))
    return Check(name, True, f"the master weights after each of the {len(expected)} steps match torch's "
                             f"GradScaler and Adam, and the float16 weights are them rounded ({TOLERANCE_TEXT})")
