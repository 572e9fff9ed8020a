"""p22's sizes, its data (where the poisoned sample and the spike sit: the seed's), and the float32 serial truth.

Each of the S steps trains on a global batch of B = N·R rows, rank r holding rows r·R..(r+1)·R-1 of it. Two steps
are not like the others, and which ones (and, for the poison, which rank and row) comes from the seed:
  - the poisoned step: one sample's input holds a NaN (a corrupted record);
  - the spike step: its targets are SPIKE times larger than the others' (an outlier shard), so a squared error
    exceeds float16's largest number, 65,504, and a loss computed in float16 is inf. Gradient clipping is there
    for it: the float32 run clips that step's gradient to MAX_NORM.
The float32 reference drops the poisoned sample (the step's loss averaged over its B - 1 clean rows) and trains on
every step, clipped to MAX_NORM (torch.nn.utils.clip_grad_norm_'s coefficient) and SGD.
"""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch


N, R, L, D, H = 4, 8, 2, 32, 64
B = N * R  # rows of a step's global batch
STEPS, LR, MAX_NORM = 8, 0.02, 50.0  # an ordinary step's gradient norm is 25 to 40: only the spike is clipped
INIT_SCALE = 64.0  # the loss scale (static: once the causes are fixed nothing overflows)
SPIKE = 100.0  # the spike step's targets are this many times the others': a row's squared error, ~32·100², is inf
#               in float16
PSI = 2 * L * D * H  # weights: 8,192
F32 = 4
GRADIENT_BYTES = F32 * PSI  # 32,768: the float32 gradients
ALL_REDUCE_BYTES = 2 * (N - 1) * GRADIENT_BYTES // N  # 49,152
# Tolerances, float32 reference against a float16 run (measured over seeds in tests/test_p22_nan.py's slow test):
LOSS_TOLERANCE = 1e-3  # every logged loss within 0.1% (relative) of the float32 reference's
WEIGHT_TOLERANCE = 2e-3  # the final master weights within 2e-3 x max(1, largest |expected|)


def _generator(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 7_919 + salt)


def fault_of(seed: int) -> dict:
    """Where the faults sit at this seed: the poisoned step, rank, row and column; the spike step (another step)."""
    g = _generator(seed, 22)
    poison_step, spike = torch.randperm(STEPS - 1, generator=g)[:2].add(1).tolist()  # never step 0
    rank, row, col = (int(torch.randint(0, n, (1,), generator=g)) for n in (N, R, D))
    return {"poison_step": poison_step, "poison_rank": rank, "poison_row": row, "poison_col": col,
            "spike_step": spike}


def make_inputs(seed: int) -> dict:
    x, target = make_batch(STEPS * B, D, seed * 1_009 + 22)
    x, target = x.float(), target.float()
    fault = fault_of(seed)
    s = fault["spike_step"]
    target[s * B:(s + 1) * B] *= SPIKE
    x[fault["poison_step"] * B + fault["poison_rank"] * R + fault["poison_row"], fault["poison_col"]] = float("nan")
    layers = [(w1.float(), w2.float()) for w1, w2 in init_layers(L, D, H, seed * 31 + 22, requires_grad=False)]
    return {"layers": layers, "x": x, "target": target, "lr": LR, "max_norm": MAX_NORM, "init_scale": INIT_SCALE,
            **fault}


def rank_batches(inputs: dict, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The rank's share of each step's batch: S pairs (x [R, D], target [R, D]), float32."""
    out = []
    for s in range(STEPS):
        lo = s * B + rank * R
        out.append((inputs["x"][lo:lo + R], inputs["target"][lo:lo + R]))
    return out


def step_batch(inputs: dict, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    return inputs["x"][s * B:(s + 1) * B], inputs["target"][s * B:(s + 1) * B]


def reference_run(inputs: dict, clip_scaled: bool = False, keep_poison_step: bool = True) -> dict:
    """The float32 run: each step's loss over its clean rows (a row whose input is not finite dropped), its
    gradient clipped to MAX_NORM by the global norm, SGD. The loss logged at each step (before its update) and the
    masters after each step. `clip_scaled` replays clipping before unscaling (the norm INIT_SCALE times too large)."""
    layers = [(w1.clone(), w2.clone()) for w1, w2 in inputs["layers"]]
    losses, after = [], []
    for s in range(STEPS):
        x, target = step_batch(inputs, s)
        keep = torch.isfinite(x).all(dim=1)
        ws = [(w1.clone().requires_grad_(), w2.clone().requires_grad_()) for w1, w2 in layers]
        flat = [w for pair in ws for w in pair]
        loss = loss_fn(forward(x[keep], ws), target[keep])
        grads = torch.autograd.grad(loss, flat)
        norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
        if clip_scaled:
            norm = norm * inputs["init_scale"]
        coef = torch.clamp(inputs["max_norm"] / (norm + 1e-6), max=1.0)
        with torch.no_grad():
            layers = [(w1 - inputs["lr"] * coef * g1, w2 - inputs["lr"] * coef * g2)
                      for (w1, w2), g1, g2 in zip(ws, grads[0::2], grads[1::2])]
        losses.append(float(loss.detach()))
        after.append([(w1.detach(), w2.detach()) for w1, w2 in layers])
    return {"losses": losses, "weights": after[-1], "after_each_step": after}
