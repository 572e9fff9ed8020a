"""What p19's harness does on each rank around the learner's optimizer: the process groups of the layout, the
model's forward and backward with the tensor-parallel pair's two all-reduces (the grader's, not the learner's:
the puzzle is the step after them), the faults written into a gradient, and the records the checks read (`steps`:
one run of the optimizer, step by step).

Runs on the rank, inside the grader's program, on both backends. The records (the weights after each step) are
cloned with the dispatch modes off: they are the grader's own, off the rank's ledger and clock, so that the
optimizer state read off the ledger between steps is the learner's alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from puzzles.model import loss_fn, rms_norm

from ...core import probe
from ..common.optimizer_state import changes, snapshot, state_tensors
from .layout import D, L, PARAM_NAMES, PARTS, T, Fault, skipped_steps


def make_groups(dist):
    """(tensor-parallel group, data-parallel group) of this rank. Every rank creates every group, in one order,
    as torch.distributed requires."""
    mine = {}
    for kind, groups in (("tp", [[T * dp + t for t in range(T)] for dp in range(D)]),
                         ("dp", [[tp + T * k for k in range(D)] for tp in range(T)])):
        for ranks in groups:
            made = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                mine[kind] = made
    return mine["tp"], mine["dp"]


class _SumOverPair(torch.autograd.Function):
    """The sum over the tensor-parallel pair, in one direction of autograd only: in the forward pass for the
    partial outputs of the row-parallel w2 (Megatron's g), in the backward pass for the partial gradients of the
    column-parallel w1's input (f). The other direction passes the tensor through."""

    @staticmethod
    def forward(ctx, t, dist, group, in_forward: bool):
        ctx.pair = None if in_forward else (dist, group)
        if not in_forward:
            return t.view_as(t)
        summed = t.detach().clone()
        dist.all_reduce(summed, group=group)
        return summed

    @staticmethod
    def backward(ctx, grad):
        if ctx.pair is None:
            return grad, None, None, None
        dist, group = ctx.pair
        whole = grad.contiguous().clone()  # each rank's partial input gradient, summed over the pair
        dist.all_reduce(whole, group=group)
        return whole, None, None, None


def pair_forward(dist, group, x: torch.Tensor, params: list) -> torch.Tensor:
    """The model on one rank of a tensor-parallel pair: each block x + g(gelu(f(rms_norm(x, norm)) @ w1_r) @ w2_r)
    + bias, every rank of the pair ending with the whole output."""
    per = len(PARTS)
    for i in range(L):
        norm, w1, w2, bias = params[i * per:(i + 1) * per]
        a = _SumOverPair.apply(rms_norm(x, norm), dist, group, False)
        x = x + _SumOverPair.apply(F.gelu(a @ w1) @ w2, dist, group, True) + bias
    return x


def inject(params: list, fault: Fault) -> None:
    """Write the fault's value into one entry of the gradient it names (after backward, before step())."""
    with torch.no_grad():
        params[PARAM_NAMES.index(fault.param)].grad[fault.index] = fault.value


def record(tensors) -> list[torch.Tensor]:
    """Clones of `tensors` that are the grader's record: off the rank's ledger and clock."""
    with torch.no_grad(), _disable_current_modes():
        return [t.detach().clone() for t in tensors]


def as_number(value):
    """What step() returned, as a float when it is one number (a float, an int, a one-element tensor); else its
    repr, for the message."""
    try:
        if isinstance(value, torch.Tensor):
            with _disable_current_modes():
                return float(value.detach().reshape(-1)[0]) if value.numel() == 1 else repr(value)
        return float(value)
    except (TypeError, ValueError):
        return repr(value)


def steps(dist, opt, params, xs, targets, faults, tp_group, before) -> dict:
    """Forward, backward, the faults of this rank, step() and what the checks read, one batch a step. `before`:
    the bytes held before the optimizer was made (None: the state is not measured)."""
    rank = dist.get_rank()
    named = dict(zip(PARAM_NAMES, params))
    skipped = skipped_steps(faults)
    out = {"weights": [], "norms": [], "skips": {}, "state_per_step": []}
    for step, (x, target) in enumerate(zip(xs, targets), 1):
        loss = loss_fn(pair_forward(dist, tp_group, x, params), target)
        loss.backward()
        del loss
        for fault in faults:
            if fault.step == step and fault.rank == rank:
                inject(params, fault)
        taken = snapshot(opt, named) if step in skipped else None
        out["norms"].append(as_number(opt.step()))
        for p in params:
            p.grad = None
        if taken is not None:
            out["skips"][step] = changes(taken, opt, named)
            del taken
        if before is not None:
            out["state_per_step"].append(probe.memory_now() - before)
        out["weights"].append(record(params))
    return out


def kept_state(opt, params) -> list[tuple[str, int, str]]:
    """(path, elements, dtype) of every tensor the optimizer keeps, the parameters themselves left out."""
    theirs = {p.untyped_storage().data_ptr() for p in params}
    return [(path, t.numel(), str(t.dtype).replace("torch.", "")) for path, t in state_tensors(opt)
            if t.untyped_storage().data_ptr() not in theirs]
