"""p11's sizes, its rank layout and the serial model cut into the pieces each rank holds.

The layout is Megatron-LM's order, tensor-parallel fastest, then data-parallel, then pipeline:

    rank = tp + T·dp + T·D·pp            (T = D = P = 2: rank = tp + 2·dp + 4·pp)

so the two ranks of a tensor-parallel group are neighbours (in a real cluster, GPUs of one node, whose links carry
the activations' all-reduces of every block), the data-parallel replicas of a shard are T apart, and the pipeline
stages of a replica T·D apart. Everything here is plain data and torch, shared by the spec and its diagnoses.
"""

from __future__ import annotations

from itertools import product

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import CostModel

from ..common.costs import ZERO, block_costs, loss_costs

D, P, T = 2, 2, 2  # data-parallel replicas, pipeline stages, tensor-parallel ranks
WORLD = D * P * T
B, M, DIM, H, L = 32, 4, 64, 512, 4  # batch, microbatches per replica, d, h, blocks
BR = B // D  # rows per replica
MB = BR // M  # rows per microbatch
HS = H // T  # hidden columns per tensor-parallel rank
PER = L // P  # blocks per stage
F64 = 8
COST = CostModel(latency_ticks=0, bytes_per_tick=4096)
# One microbatch through one stage on one rank, every op counted (common/costs.py): each block with this rank's slices is
# the plain block with h/t hidden columns (2 matmuls, gelu, the residual add after g's all-reduce); its backward
# adds each weight gradient into the zeroed w.grad. The last stage computes the microbatch's loss too.
_BLOCK = block_costs(MB, DIM, HS, COST, input_grad=True, accumulate=True)
FORWARD, BACKWARD = PER * _BLOCK[0], PER * _BLOCK[1]
LOSS_FORWARD, LOSS_BACKWARD = loss_costs(MB, DIM, COST, divide_by=M)
F_FLOPS = FORWARD.flops
W = 2 * L * DIM * H * F64  # bytes of the whole model's weights
W_RANK = W // (P * T)  # what one rank holds: its stage's blocks, its tensor-parallel slice of each
ACT = PER * (2 * MB * HS + MB * DIM) * F64  # one microbatch's saved activations on one rank's stage
ACTIVATION = MB * DIM * F64  # one [mb, d] activation or its gradient: what a send and a TP all-reduce carry
TP_BYTES = 2 * M * PER * 2 * (T - 1) * ACTIVATION // T  # per rank: an all-reduce per block per microbatch each way
DP_BYTES = 2 * (D - 1) * W_RANK // D  # per rank: one all-reduce of its gradients
PRODUCTS = M * 3 * PER * 2 * (2 * MB * DIM * HS)  # per rank: its matmuls, 2 per block forward and 4 backward
STAGE_WORK = [M * (FORWARD + BACKWARD + (LOSS_FORWARD + LOSS_BACKWARD if pp == P - 1 else ZERO)) for pp in range(P)]
# Room for bookkeeping: one elementwise op over the rank's gradients (dividing them by D before or after their
# all-reduce) and one over each microbatch's [mb, d] gradient.
ALLOWANCE = W_RANK // F64 + M * MB * DIM
SHARE_FLOPS = STAGE_WORK[P - 1].flops + ALLOWANCE  # per rank, at most: the last stage's work (the busiest)


def coords(rank: int) -> tuple[int, int, int]:
    """(pp, dp, tp) of a global rank."""
    return rank // (T * D), (rank // T) % D, rank % T


def rank_of(pp: int, dp: int, tp: int) -> int:
    return tp + T * dp + T * D * pp


def tp_ranks(rank: int) -> list[int]:
    pp, dp, _ = coords(rank)
    return [rank_of(pp, dp, t) for t in range(T)]


def dp_ranks(rank: int) -> list[int]:
    pp, _, tp = coords(rank)
    return [rank_of(pp, k, tp) for k in range(D)]


def pp_ranks(rank: int) -> list[int]:
    _, dp, tp = coords(rank)
    return [rank_of(s, dp, tp) for s in range(P)]


EXPECTED_GROUPS = {"tp": tp_ranks, "dp": dp_ranks, "pp": pp_ranks}
GROUP_NAMES = {"tp": "tensor-parallel", "dp": "data-parallel", "pp": "pipeline"}


def partition(kind: str) -> list[list[int]]:
    """Every group of one kind in the puzzle's layout: partition('tp') = [[0, 1], [2, 3], [4, 5], [6, 7]]."""
    seen = []
    for r in range(WORLD):
        g = EXPECTED_GROUPS[kind](r)
        if g not in seen:
            seen.append(g)
    return seen


def other_layouts() -> dict[str, dict[str, list[list[int]]]]:
    """The groups of every other order of the three axes (name: 'pp fastest, then tp, then dp'), for naming the
    layout a learner's groups follow instead."""
    layouts = {}
    for order in product("tdp", repeat=3):
        if len(set(order)) != 3 or order == ("t", "d", "p"):
            continue
        sizes = {"t": T, "d": D, "p": P}

        def rank(c, order=order):
            r, stride = 0, 1
            for axis in order:
                r += c[axis] * stride
                stride *= sizes[axis]
            return r

        groups = {}
        for kind, axis in (("tp", "t"), ("dp", "d"), ("pp", "p")):
            found = []
            for fixed in product(range(2), repeat=2):
                others = [a for a in "tdp" if a != axis]
                c = dict(zip(others, fixed))
                found.append(sorted(rank({**c, axis: i}) for i in range(sizes[axis])))
            groups[kind] = sorted(found)
        words = {"t": "tp", "d": "dp", "p": "pp"}
        layouts[f"{words[order[0]]} fastest, then {words[order[1]]}, then {words[order[2]]}"] = groups
    return layouts


def shard(layers, rank: int):
    """Rank r's weights: its stage's blocks, the r-th tensor-parallel slice of each (w1's columns, w2's rows)."""
    pp, _, tp = coords(rank)
    cols = slice(tp * HS, (tp + 1) * HS)
    return [(w1.detach()[:, cols].clone(), w2.detach()[cols, :].clone())
            for w1, w2 in layers[pp * PER:(pp + 1) * PER]]


def rows(dp: int) -> slice:
    return slice(dp * BR, (dp + 1) * BR)


def serial(inputs) -> dict:
    """The serial step: every block's gradient of the full-batch loss, and, for each replica, the gradient of its
    own loss (loss_fn over its 16 rows) with respect to each stage's input."""
    layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
              for w1, w2 in inputs["layers"]]
    loss_fn(forward(inputs["x"], layers), inputs["target"]).backward()
    grads = [(w1.grad, w2.grad) for w1, w2 in layers]
    input_grads, local = [], []
    for dp in range(D):
        replica = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
                   for w1, w2 in inputs["layers"]]
        a, acts, outs = inputs["x"][rows(dp)], [], []
        for s in range(P):
            a = a.detach().requires_grad_()
            acts.append(a)
            a = forward(a, replica[s * PER:(s + 1) * PER])
            outs.append(a)
        loss_fn(outs[-1], inputs["target"][rows(dp)]).backward()
        for s in reversed(range(P - 1)):
            outs[s].backward(acts[s + 1].grad)
        input_grads.append([a.grad for a in acts])
        local.append([(w1.grad, w2.grad) for w1, w2 in replica])  # this replica's own, before averaging
    return {"grads": grads, "input_grads": input_grads, "local_grads": local}


def sliced(grads, rank: int):
    """The serial gradients of rank r's blocks, cut to its tensor-parallel slice."""
    pp, _, tp = coords(rank)
    cols = slice(tp * HS, (tp + 1) * HS)
    return [(g1[:, cols], g2[cols, :]) for g1, g2 in grads[pp * PER:(pp + 1) * PER]]


def groups_of(dist, groups) -> dict:
    """What build_3d_groups returned, as plain data: {"tp": [ranks], "dp": [...], "pp": [...]}, or {"problem":
    what it was instead}. Read, never trusted: an answer may return anything."""
    if not isinstance(groups, (tuple, list)) or len(groups) != 3:
        what = f"a {type(groups).__name__}" + (f" of {len(groups)}" if isinstance(groups, (tuple, list)) else "")
        return {"problem": f"build_3d_groups returned {what}, not the three groups (tp_group, dp_group, pp_group)"}
    out = {}
    for kind, g in zip(("tp", "dp", "pp"), groups):
        try:
            out[kind] = [int(r) for r in dist.get_process_group_ranks(g)]
        except Exception:
            out[kind] = f"not a process group ({type(g).__name__})"
    return out


def detached(t):
    return t.detach() if isinstance(t, torch.Tensor) else t
