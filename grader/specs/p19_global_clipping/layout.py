"""p19's sizes, its rank layout, the model cut into the pieces each rank holds, the faults the harness injects, and
the serial truth: torch.nn.utils.clip_grad_norm_ and torch.optim.Adam on the whole model.

The layout is Megatron-LM's order (as p11's): a tensor-parallel pair of neighbours, two data-parallel replicas,

    rank = tp + T·dp      (T = D = 2)      tensor-parallel pairs [0, 1] [2, 3], data-parallel pairs [0, 2] [1, 3]

Each block is a pre-norm MLP with an output bias, y = x + gelu(rms_norm(x, norm) @ w1) @ w2 + bias: w1's columns and
w2's rows are split across the pair (puzzle 4's Megatron MLP), the norm's scale and the bias are held whole by both
ranks of the pair (replicated, as Megatron replicates its norms and a row-parallel layer's bias). Every rank
flattens its own parameters in the order of PARAM_NAMES and keeps Adam's state for its data-parallel half of them
(ZeRO-2, puzzle 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from puzzles.model import DTYPE, loss_fn, make_batch, rms_norm

T, D = 2, 2  # tensor-parallel ranks per pair, data-parallel replicas
N = T * D
L, DIM, H = 2, 32, 128  # blocks, d, h
HS = H // T  # hidden columns per tensor-parallel rank
B = 16  # rows per step (B/D per replica)
BR = B // D
K_STEPS = 5
TARGET_SCALES = (1, 4, 4, 1, 4)  # targets x4: gradient norms above MAX_NORM (clipped), x1: below (untouched)
LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
MAX_NORM = 100.0
CLIP_EPS = 1e-6  # clip_grad_norm_'s max_norm / (norm + 1e-6)
F64 = 8
PARTS = ("norm", "w1", "w2", "bias")  # one block's parameters, in the order each rank flattens them
REPLICATED = {"norm": True, "w1": False, "w2": False, "bias": True}
PARAM_NAMES = tuple(f"layers[{i}].{p}" for i in range(L) for p in PARTS)
PSI = L * (2 * DIM * H + 2 * DIM)  # the serial model's parameters
PSI_RANK = L * (2 * DIM * HS + 2 * DIM)  # one rank's: its slices of w1, w2 and the whole norm and bias
SHARD = PSI_RANK // D  # the elements of one rank's ZeRO shard (here: exactly one block's)
PSI_REPLICATED = L * 2 * DIM
REDUCTION = 2 * (D - 1) * F64 * PSI_RANK // D  # per step: a reduce-scatter of the gradients and an all-gather
TOL = 1e-8  # float64: a right answer is within 1e-12 or so


def coords(rank: int) -> tuple[int, int]:
    """(dp, tp) of a global rank."""
    return rank // T, rank % T


def tp_ranks(rank: int) -> list[int]:
    dp, _ = coords(rank)
    return [T * dp + t for t in range(T)]


def rows(dp: int) -> slice:
    return slice(dp * BR, (dp + 1) * BR)


# ---- the model


def init_params(seed: int) -> dict[str, torch.Tensor]:
    """The serial model's parameters by name, scaled so that activations stay of order one."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for i in range(L):
        params[f"layers[{i}].norm"] = 1 + 0.1 * torch.randn(DIM, generator=g, dtype=DTYPE)
        params[f"layers[{i}].w1"] = torch.randn(DIM, H, generator=g, dtype=DTYPE) / math.sqrt(DIM)
        params[f"layers[{i}].w2"] = torch.randn(H, DIM, generator=g, dtype=DTYPE) / math.sqrt(H) / 2
        params[f"layers[{i}].bias"] = 0.1 * torch.randn(DIM, generator=g, dtype=DTYPE)
    return params


def serial_forward(x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    for i in range(L):
        p = [params[f"layers[{i}].{name}"] for name in PARTS]
        x = x + F.gelu(rms_norm(x, p[0]) @ p[1]) @ p[2] + p[3]
    return x


def rank_slice(name: str, tensor: torch.Tensor, rank: int) -> torch.Tensor:
    """What rank `rank` holds of the serial parameter `name`: w1's columns and w2's rows of its tensor-parallel
    slice, the norm and the bias whole."""
    _, tp = coords(rank)
    cols = slice(tp * HS, (tp + 1) * HS)
    if name.endswith(".w1"):
        return tensor[:, cols]
    if name.endswith(".w2"):
        return tensor[cols, :]
    return tensor


def rank_params(params: dict[str, torch.Tensor], rank: int) -> list[torch.Tensor]:
    return [rank_slice(name, params[name], rank).clone() for name in PARAM_NAMES]


def assemble(pair: list, own: list) -> dict[str, torch.Tensor]:
    """The serial parameters put back together from the two ranks of a tensor-parallel pair (`pair[tp]`: rank
    tp's list in PARAM_NAMES order), the replicated ones taken from `own`."""
    out = {}
    for i, name in enumerate(PARAM_NAMES):
        if name.endswith(".w1"):
            out[name] = torch.cat([p[i] for p in pair], dim=1)
        elif name.endswith(".w2"):
            out[name] = torch.cat([p[i] for p in pair], dim=0)
        else:
            out[name] = own[i]
    return out


# ---- the faults


@dataclass(frozen=True)
class Fault:
    """What the harness writes into one rank's gradient after backward and before step()."""

    step: int  # 1-based
    rank: int
    param: str  # a name of PARAM_NAMES
    index: tuple
    value: float

    def describe(self) -> str:
        return f"{self.value} in rank {self.rank}'s {self.param}.grad{list(self.index)} at step {self.step}"


# A NaN in a sharded weight, which the reduce-scatter carries to the other replica's rank of the same slice (rank 1
# hands it to rank 3, who owns layers[1]); then an inf in one copy of a replicated parameter (rank 3's bias: rank
# 2's copy stays finite), which lands in rank 1's shard: a norm that counts replicated parameters on one rank of
# the pair only does not see it.
FAULTS = (Fault(3, 1, "layers[1].w1", (0, 0), float("nan")), Fault(5, 3, "layers[0].bias", (0,), float("inf")))
# The second run, on a fresh optimizer: batches 1 and 2, a NaN at its step 1 on rank 2 (in its own shard).
PROBE_STEPS = 2
STEPS_IN_ALL = K_STEPS + PROBE_STEPS  # step() calls in all, both runs
PROBE_FAULTS = (Fault(1, 2, "layers[1].w2", (0, 0), float("nan")),)


def skipped_steps(faults) -> set[int]:
    return {f.step for f in faults}


def run_of(out: dict, run: str) -> dict:
    """One rank's record of the main run ("main") or of the second run ("probe")."""
    return out if run == "main" else (out.get("probe") or {})


def make_inputs(seed: int) -> dict:
    x, target = make_batch(B * K_STEPS, DIM, seed)
    batches = [(xs, ts * scale) for xs, ts, scale in zip(x.chunk(K_STEPS), target.chunk(K_STEPS), TARGET_SCALES)]
    return {"params": init_params(seed + 1), "batches": batches}


def probe_batches(batches):
    return batches[:PROBE_STEPS]


# ---- the serial truth


def torch_reference(params, batches, skipped) -> dict:
    """clip_grad_norm_ then torch.optim.Adam on the serial model, one batch a step; a step in `skipped` (a
    non-finite gradient somewhere) takes no step at all. The weights after each step and each step's norm (NaN
    for a skipped one)."""
    ps = {name: t.detach().clone().requires_grad_() for name, t in params.items()}
    adam = torch.optim.Adam(list(ps.values()), lr=LR, betas=BETAS, eps=EPS, foreach=False)
    weights, norms = [], []
    for step, (x, target) in enumerate(batches, 1):
        loss_fn(serial_forward(x, ps), target).backward()
        if step in skipped:
            norms.append(float("nan"))
        else:
            norms.append(torch.nn.utils.clip_grad_norm_(list(ps.values()), MAX_NORM, foreach=False).item())
            adam.step()
        adam.zero_grad(set_to_none=True)
        weights.append({name: t.detach().clone() for name, t in ps.items()})
    return {"weights": weights, "norms": norms}


def gradient(params: dict[str, torch.Tensor], batch) -> dict[str, torch.Tensor]:
    """The full-batch gradient of the serial model at `params`."""
    ps = {name: t.detach().clone().requires_grad_() for name, t in params.items()}
    x, target = batch
    loss_fn(serial_forward(x, ps), target).backward()
    return {name: t.grad for name, t in ps.items()}


def replay(params, batches, skipped, clamp=True, clip=True, count_skipped=False) -> list[dict]:
    """The serial run written by hand, with knobs that make the common mistakes of the update: the coefficient
    max_norm / (norm + 1e-6) applied even when it is above 1 (`clamp=False`), no clipping at all (`clip=False`),
    and Adam's step count advanced by a skipped step (`count_skipped`). The weights after each step."""
    ws = {name: t.detach().clone() for name, t in params.items()}
    m = {name: torch.zeros_like(t) for name, t in ws.items()}
    v = {name: torch.zeros_like(t) for name, t in ws.items()}
    (beta1, beta2), t, out = BETAS, 0, []
    for step, batch in enumerate(batches, 1):
        grads = gradient(ws, batch)
        if step in skipped:
            t += 1 if count_skipped else 0
            out.append({name: w.clone() for name, w in ws.items()})
            continue
        t += 1
        norm = torch.sqrt(sum((g * g).sum() for g in grads.values()))
        coef = MAX_NORM / (norm + CLIP_EPS) if clip else torch.ones(())
        if clamp:
            coef = coef.clamp(max=1.0)
        for name, w in ws.items():
            g = grads[name] * coef
            m[name].mul_(beta1).add_(g, alpha=1 - beta1)
            v[name].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            w.addcdiv_(m[name], (v[name] / (1 - beta2 ** t)).sqrt() + EPS, value=-LR / (1 - beta1 ** t))
        out.append({name: w.clone() for name, w in ws.items()})
    return out


# ---- what the common mistakes of the norm give


def norm_candidates(grads: dict[str, torch.Tensor], rank: int) -> list[tuple[float, str]]:
    """(the norm a mistake reports on `rank`, what the mistake is), from the full-batch gradient of a step."""
    sq = {name: float((g * g).sum()) for name, g in grads.items()}
    sharded = sum(s for name, s in sq.items() if not REPLICATED[name.split(".")[-1]])
    replicated = sum(s for name, s in sq.items() if REPLICATED[name.split(".")[-1]])
    dp, tp = coords(rank)
    mine = {name: float((rank_slice(name, g, rank) ** 2).sum()) for name, g in grads.items()}
    shard_names = PARAM_NAMES[dp * len(PARTS) * L // D:(dp + 1) * len(PARTS) * L // D]  # this rank's ZeRO half
    own_shard = sum(mine[name] for name in shard_names)
    own_slice = sum(mine.values())
    pair = [sum(float((rank_slice(name, grads[name], r) ** 2).sum()) for name in shard_names
                if REPLICATED[name.split(".")[-1]] == repl) for r in tp_ranks(rank) for repl in (False, True)]
    pair_once, pair_twice = pair[0] + pair[2] + pair[1], sum(pair)  # (sharded, replicated) per rank of the pair
    true = math.sqrt(sharded + replicated)
    return [
        (math.sqrt(sharded + T * replicated),
         f"the replicated parameters (the norms' scales and the biases: {PSI_REPLICATED} numbers, held whole by "
         f"both ranks of a tensor-parallel pair) were counted {T} times, once per rank that holds them: count each "
         f"parameter once (say, its squares divided by {T} on each rank of the pair, or added on one rank only)"),
        (math.sqrt(sharded), "the replicated parameters (the norms' scales and the biases) were left out of the norm: "
                             "count them once"),
        (math.sqrt(own_shard), f"a local norm: rank {rank} reported the norm of its own shard of the gradient, with "
                               f"no all-reduce: the global norm adds every rank's sum of squares"),
        (math.sqrt(own_slice), f"the norm of rank {rank}'s own parameters (its tensor-parallel slices and the "
                               f"replicated ones): the sum of squares was all-reduced over the data-parallel group "
                               f"only; add the tensor-parallel pair's too"),
        (math.sqrt(pair_once), "the sum of squares was all-reduced over the tensor-parallel pair only: add the "
                               "data-parallel group's too"),
        (math.sqrt(pair_twice), "the sum of squares was all-reduced over the tensor-parallel pair only (add the "
                                "data-parallel group's too), the replicated parameters counted on both ranks"),
        (math.sqrt(sharded + T * T * replicated),
         f"the replicated parameters' gradients are {T} times too large: were they all-reduced over the "
         f"tensor-parallel pair? f's all-reduce in backward already gives both ranks the whole gradient of the "
         f"norms' scales and the biases"),
        (D * true, f"{D} times the global norm: the gradients were summed over the data-parallel group, not averaged"),
        (true / D, f"1/{D} of the global norm: the gradients were divided by {D} twice"),
        (true * true, "the sum of squares, not its square root"),
    ]
