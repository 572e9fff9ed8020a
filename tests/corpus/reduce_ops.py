"""Reduce ops on dtypes that torch.distributed refuses, and ops it does not know."""

import torch

from .case import RAISED, case
from .data import randint, randn


@case(4, sim=ValueError, gloo={RAISED})
def bitwise_and_of_floats(dist):
    """all_reduce BAND of float64 (gloo: "Cannot use ReduceOp.BAND with non-integral dtype")"""
    x = randn(dist, 3)
    dist.all_reduce(x, op=dist.ReduceOp.BAND)
    return x


@case(4, sim=ValueError, gloo={RAISED})
def bitwise_xor_reduce_scatter_of_floats(dist):
    """reduce_scatter_tensor BXOR of float32"""
    out = torch.empty(2, dtype=torch.float32)
    dist.reduce_scatter_tensor(out, randn(dist, 8, dtype=torch.float32), op=dist.ReduceOp.BXOR)
    return out


@case(4, sim=ValueError, gloo={RAISED})
def average_of_integers(dist):
    """all_reduce AVG of int64 (gloo: "result type Float can't be cast to the desired output type Long")"""
    x = randint(dist, 3)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    return x


@case(4, sim=ValueError, gloo={RAISED})
def average_reduce_scatter_of_integers(dist):
    """reduce_scatter_tensor AVG of int64"""
    out = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, randint(dist, 8), op=dist.ReduceOp.AVG)
    return out


@case(4, sim=TypeError, gloo={RAISED})
def reduce_op_as_a_string(dist):
    """all_reduce with op="sum" (torch: TypeError, a string is not a ReduceOp)"""
    x = randn(dist, 3)
    dist.all_reduce(x, op="sum")
    return x


@case(4, sim=ValueError, gloo={RAISED})
def premul_sum(dist):
    """all_reduce with torch.distributed.ReduceOp.PREMUL_SUM (NCCL's alone)"""
    import torch.distributed as td

    x = randn(dist, 3)
    dist.all_reduce(x, op=td.ReduceOp.PREMUL_SUM)
    return x
