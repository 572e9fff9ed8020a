"""Collectives on tensors that require grad, as a learner writes them around autograd (p2 gathers a checkpoint it
then recomputes from; p8 keeps master weights): gloo writes the gathers and reduce_scatter_tensor through views
of its own, which autograd refuses while it records; all_reduce, broadcast and recv it does not."""

import torch

from puzzles.sim import AutogradWriteError

from .case import RAISED, case


def _leaf(n):
    return torch.zeros(n, dtype=torch.float64).requires_grad_()


@case(2, sim=AutogradWriteError, gloo={RAISED})
def all_gather_into_tensor_output_requires_grad(dist):
    """the output requires grad (p2: `full.requires_grad_()` before the gather): "Output 0 of Split is a view ..." """
    full = _leaf(4)
    dist.all_gather_into_tensor(full, torch.ones(2, dtype=torch.float64))
    return full.detach()


@case(2, sim=AutogradWriteError, gloo={RAISED})
def all_gather_into_tensor_input_requires_grad(dist):
    """the input requires grad: "A view was created in no_grad mode and is being modified inplace ..." """
    out = torch.zeros(4, dtype=torch.float64)
    dist.all_gather_into_tensor(out, torch.ones(2, dtype=torch.float64).requires_grad_())
    return out


@case(2, sim=AutogradWriteError, gloo={RAISED})
def all_gather_list_requires_grad(dist):
    """all_gather into tensors that require grad: "a leaf Variable that requires grad is being used in an
    in-place operation" """
    outs = [_leaf(2) for _ in range(2)]
    dist.all_gather(outs, torch.ones(2, dtype=torch.float64))
    return [o.detach() for o in outs]


@case(2, sim=AutogradWriteError, gloo={RAISED})
def reduce_scatter_output_requires_grad(dist):
    """reduce_scatter_tensor into a leaf that requires grad"""
    out = _leaf(2)
    dist.reduce_scatter_tensor(out, torch.ones(4, dtype=torch.float64))
    return out.detach()


@case(2)
def all_gather_into_tensor_requires_grad_under_no_grad(dist):
    """the same gather under torch.no_grad(): fine on both"""
    full = _leaf(4)
    with torch.no_grad():
        dist.all_gather_into_tensor(full, torch.full((2,), 1.0 + dist.get_rank(), dtype=torch.float64))
    return full.detach()


@case(2)
def all_reduce_leaf_requires_grad(dist):
    """all_reduce of a leaf that requires grad: gloo writes its raw memory, autograd does not see it"""
    x = torch.full((3,), 1.0 + dist.get_rank(), dtype=torch.float64).requires_grad_()
    dist.all_reduce(x)
    return x.detach()


@case(2)
def gather_then_require_grad(dist):
    """the remedy the error names: gather into a plain buffer, then make it a leaf"""
    full = torch.empty(4, dtype=torch.float64)
    dist.all_gather_into_tensor(full, torch.full((2,), 1.0 + dist.get_rank(), dtype=torch.float64))
    full.requires_grad_()
    (full * full).sum().backward()
    return full.grad
