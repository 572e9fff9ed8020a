# Generated from solutions/p22_nan.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest d06c2de4717f)
"""Puzzle 22 — The NaN: a float16 run whose loss turns nan, its causes found and fixed.

The task: `train_fp16` below, as handed to you, trains puzzle 9's model in float16 on 4 ranks (data parallel,
float32 master weights, a loss scale, gradient clipping), and its log reads `loss nan` at one step and `loss inf`
at another, while the loss it does print falls far more slowly than the float32 run's. Find each cause with the
tools (the log, `torch.autograd.set_detect_anomaly(True)`, the scale and the skipped steps, the loss of each
sample) and fix it, so that the run matches the float32 reference. Where the faults sit, which step, rank and row,
changes with the seed (`--seed N`), as it does from one job to the next: a fix that names a row fails at another
seed. The checks (N = 4 ranks, R = 8 rows each, a global batch of B = 32; S = 8 steps of SGD, lr = 0.02,
gradients clipped to a global norm of 50; L = 2 blocks, d = 32, h = 64, Ψ = 8,192 weights; loss scale 64):
  - loss curve: the loss logged at each of the 8 steps within 0.1% (relative) of the float32 reference's, which
    drops the poisoned sample (its step's loss is the mean over the 31 clean rows) and trains on every step.
  - weights: every rank's float32 master weights after the 8 steps within 2e-3 x max(1, largest |expected|) of
    the float32 reference's (float16's 10-bit mantissa, not float64's 1e-8). Measured over 30 seeds, the
    reference answer's losses are at most 1.1e-4 off (relative) and its weights 8.0e-5, nine and twenty-five
    times inside the tolerances.
  - every step taken: each step changes the master weights. Skipping a step whose loss is not finite, or zeroing
    its non-finite gradients (torch.nan_to_num), throws away its 31 good samples along with the bad one: that
    silences the symptom and keeps the cause.
  - communication: the bytes each rank sends, at most S·2(N-1)/N·G + 1 KiB = 8 x 49,152 + 1,024 = 394,240 bytes
    (G = 4·Ψ = 32,768, the float32 gradients once a step; 1 KiB for scalars such as the count of clean rows): a
    fix that gathers the whole batch to inspect it does not fit.

The symptom, as a real job shows it:

    the program as handed out (seed 3)           the float32 run
    step 0  loss 77.14     scale 64              step 0  loss 77.14
    step 1  loss 70.84     scale 64              step 1  loss 66.37
    step 2  loss inf       scale 64              step 2  loss 314,207.75   (the spike)
    step 3  loss 69.75     scale 64              step 3  loss 65.88
    step 4  loss 73.55     scale 64              step 4  loss 62.66
    step 5  loss 73.41     scale 64              step 5  loss 59.70
    step 6  loss 69.67     scale 64              step 6  loss 57.41
    step 7  loss nan       scale 32  (skipped)   step 7  loss 53.47        (rank 3's row 1 holds a NaN)

The inf at step 2 is only in the loss: the backward of a squared error is 2·(y - target), finite, so that step
is taken; the nan at step 7 reaches every gradient, and the loss scaler skips the step and halves the scale.

Three causes, of three kinds, each with its own evidence:
  - **an overflow in the forward.** A float16 number is at most 65,504. The spike step's targets are 100 times
    the others' (an outlier shard), so a sample's squared error summed over its 32 features, about 32 x 100² =
    320,000, is inf in float16 whatever the loss scale: the loss is inf *before* it is scaled, and lowering the
    loss scale or the learning rate leaves it inf. Evidence: the loss itself is inf (not only the gradients), and
    every sample's loss at that step is inf in float16 and finite in float32. Fix: compute the loss in float32
    (`y.float()`), as torch.autocast does: the forward's matmuls stay in float16, the loss and its sums do not.
  - **a poisoned sample.** One sample's input holds a NaN (a corrupted record), on one rank, at one step. Its
    loss is nan, and so is the mean over the batch; the gradient, x^T·dy, is nan everywhere (nan·0 is nan, so
    masking the sample's *loss* is not enough: drop the row before the forward). The loss scaler sees a
    non-finite gradient and skips the step: all 32 samples are lost for one. Evidence: the loss is nan, not
    inf; under `torch.autograd.set_detect_anomaly(True)` the backward stops at the first op that returns nan,
    the loss's own; the loss of each sample (`loss_fn` row by row) is finite everywhere but one row of one
    rank, and `torch.isfinite(x).all(dim=1)` finds it. Fix: drop the rows whose input is not finite, count the
    clean rows of the whole batch (an all-reduce of two numbers: the clean rows' summed loss and their count),
    and average over that count.
  - **clipping before unscaling.** The gradients come out of backward multiplied by the loss scale; clipping them
    then measures a norm 64 times too large, and clips every step to a step 64 times too small (and an inf
    gradient, clipped, is nan). The loss falls, slowly: no error, just the wrong curve. Fix: unscale first
    (divide by the scale, in float32), then clip (torch.amp.GradScaler.unscale_ before clip_grad_norm_).

    float32 masters --copy--> float16 weights --forward (f16)--> y --float()--> loss (f32, clean rows only)
          ^                                                                       | x scale, backward (f16)
          +-- SGD <-- clip to 50 <-- all-reduce (SUM, f32) <-- unscale: grad.float() / scale

Write `train_fp16(dist, batches, layers, lr, max_norm, init_scale, log)`:
  - `batches`: this rank's share of each of the S steps' batches, S pairs (x [8, 32], target [8, 32]), float32;
  - `layers`: the float32 master weights, [(w1 [32, 64], w2 [64, 32])] x 2: update them in place;
  - each step: the forward and backward in float16 on float16 copies of the masters, the step's loss as the
    whole batch's mean over its clean rows (`loss_fn`), the unscaled gradients all-reduced (SUM), clipped to a
    global norm of `max_norm` (coefficient max_norm / (norm + 1e-6), at most 1, as clip_grad_norm_), then SGD
    on the masters (`w -= lr * g`). The loss scaler's skip-and-halve, which the program as handed out has, may
    stay or go: once the causes are fixed it never fires (every step taken holds that);
  - `log(loss)` once a step, after its update, with the step's loss (a tensor, the same on every rank).
The grader reads the masters at each `log` call (a step that changed no weight was skipped) and after the run.

Hints:
  - `keep = torch.isfinite(x).all(dim=1)`, then `x[keep]`: the clean rows, before the forward.
  - `stats = torch.stack([per_row.sum(), keep.sum()]).double()`, `dist.all_reduce(stats)`: the loss's share of
    this rank is `per_row.sum() / stats[1]`, the logged loss `stats[0] / stats[1]` (in float64 four ranks' float32
    sums add up exactly, so the logged loss is the same whatever order a backend adds them in).
"""

import torch

from puzzles.model import forward


def train_fp16(dist, batches, layers, lr, max_norm, init_scale, log):
    raise NotImplementedError("p22: the loss is nan at one step and inf at another: delete this line to run it as handed out, then fix it")
    masters = [w for pair in layers for w in pair]
    half = [w.half().requires_grad_() for w in masters]
    scale = init_scale
    for x, target in batches:
        y = forward(x.half(), list(zip(half[0::2], half[1::2])))
        loss = ((y - target.half()) ** 2).sum(dim=1).mean()  # float16 throughout
        (loss * scale).backward()
        grads = [h.grad.float() for h in half]
        for g in grads:
            dist.all_reduce(g)
        with torch.no_grad():
            norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            grads = [g * coef / scale / dist.get_world_size() for g in grads]  # clipped, then unscaled
            if not all(torch.isfinite(g).all() for g in grads):
                scale /= 2  # skip the step
            else:
                for w, g, h in zip(masters, grads, half):
                    w -= lr * g
                    h.copy_(w)
            for h in half:
                h.grad = None
        logged = loss.detach().float()
        dist.all_reduce(logged)
        log(logged / dist.get_world_size())
