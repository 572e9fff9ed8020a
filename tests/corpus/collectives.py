"""Every collective the simulator offers, with every reduce op on the dtypes gloo takes it for, sync and async."""

import torch

from .case import case
from .data import ramp, randint, randn


@case(4)
def all_reduce_sum_float64(dist):
    """all_reduce SUM of random float64"""
    x = randn(dist, 3, 5)
    assert dist.all_reduce(x) is None
    return x


@case(4)
def all_reduce_sum_float32(dist):
    """all_reduce SUM of random float32"""
    x = randn(dist, 7, dtype=torch.float32)
    dist.all_reduce(x)
    return x


@case(4)
def all_reduce_sum_int64(dist):
    """all_reduce SUM of int64"""
    x = randint(dist, 6)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


@case(4)
def all_reduce_sum_int8_wraps_around(dist):
    """all_reduce SUM of int8 that overflows: both wrap around"""
    x = torch.tensor([100, -100, 7], dtype=torch.int8)
    dist.all_reduce(x)
    return x


@case(4)
def all_reduce_bool(dist):
    """all_reduce of bool with SUM (logical or), PRODUCT, MIN and MAX"""
    r = dist.get_rank()
    base = torch.tensor([True, False, r == 0, r != 2])
    out = []
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        x = base.clone()
        dist.all_reduce(x, op=op)
        out.append(x)
    return out


@case(4)
def all_reduce_product(dist):
    """all_reduce PRODUCT of float64 and of int64"""
    x, n = randn(dist, 4), randint(dist, 4, low=1, high=5)
    dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
    dist.all_reduce(n, op=dist.ReduceOp.PRODUCT)
    return x, n


@case(4)
def all_reduce_min_max(dist):
    """all_reduce MIN and MAX of float64, float32 and int64"""
    out = []
    for t in (randn(dist, 5), randn(dist, 5, dtype=torch.float32), randint(dist, 5)):
        lo, hi = t.clone(), t.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        out += [lo, hi]
    return out


@case(4)
def all_reduce_avg(dist):
    """all_reduce AVG of float64 and float32 (gloo runs AVG on torch 2.13)"""
    x, y = randn(dist, 6), randn(dist, 6, dtype=torch.float32)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    return x, y


@case(4)
def all_reduce_bitwise_int64(dist):
    """all_reduce BAND, BOR and BXOR of int64"""
    x = randint(dist, 8, low=0, high=256)
    out = []
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        y = x.clone()
        dist.all_reduce(y, op=op)
        out.append(y)
    return out


@case(4)
def all_reduce_bitwise_bool_and_uint8(dist):
    """all_reduce BAND, BOR and BXOR of bool and of uint8"""
    r = dist.get_rank()
    out = []
    for base in (torch.tensor([True, False, r == 0, r != 2]), randint(dist, 6, low=0, high=256, dtype=torch.uint8)):
        for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
            y = base.clone()
            dist.all_reduce(y, op=op)
            out.append(y)
    return out


@case(4)
def all_reduce_torch_reduce_op(dist):
    """all_reduce with torch.distributed.ReduceOp.MAX itself (what a learner may write)"""
    import torch.distributed as td

    x = randn(dist, 4)
    dist.all_reduce(x, op=td.ReduceOp.MAX)
    return x


@case(4)
def all_reduce_empty(dist):
    """all_reduce of an empty tensor"""
    x = torch.empty(0, dtype=torch.float64)
    dist.all_reduce(x)
    return x


@case(3)
def all_reduce_three_ranks(dist):
    """all_reduce SUM on an odd number of ranks"""
    x = randn(dist, 2, 3)
    dist.all_reduce(x)
    return x


@case(2)
def all_reduce_two_ranks(dist):
    """all_reduce SUM on two ranks"""
    x = randn(dist, 5)
    dist.all_reduce(x)
    return x


@case(4)
def all_gather_list(dist):
    """all_gather into a list of tensors"""
    out = [torch.empty(2, 3, dtype=torch.float64) for _ in range(dist.get_world_size())]
    assert dist.all_gather(out, randn(dist, 2, 3)) is None
    return out


@case(4)
def all_gather_list_int64_and_bool(dist):
    """all_gather of int64 and of bool"""
    n = dist.get_world_size()
    ints, bools = [torch.empty(3, dtype=torch.int64) for _ in range(n)], [torch.empty(2, dtype=torch.bool) for _ in range(n)]
    dist.all_gather(ints, randint(dist, 3))
    dist.all_gather(bools, torch.tensor([dist.get_rank() % 2 == 0, True]))
    return ints, bools


@case(4)
def all_gather_into_tensor_1d(dist):
    """all_gather_into_tensor of 1-d inputs into [N*k]"""
    out = torch.empty(4 * dist.get_world_size(), dtype=torch.float64)
    assert dist.all_gather_into_tensor(out, randn(dist, 4)) is None
    return out


@case(4)
def all_gather_into_tensor_concatenated(dist):
    """all_gather_into_tensor of [2, 3] inputs into [N*2, 3] (concatenated along dim 0)"""
    out = torch.empty(2 * dist.get_world_size(), 3, dtype=torch.float32)
    dist.all_gather_into_tensor(out, randn(dist, 2, 3, dtype=torch.float32))
    return out


@case(4)
def reduce_scatter_tensor_sum(dist):
    """reduce_scatter_tensor SUM: rank r gets the sum of chunk r of every rank's input"""
    out = torch.empty(2, 3, dtype=torch.float64)
    assert dist.reduce_scatter_tensor(out, randn(dist, 2 * dist.get_world_size(), 3)) is None
    return out


@case(4)
def reduce_scatter_tensor_ops(dist):
    """reduce_scatter_tensor with AVG, MAX, MIN, PRODUCT on float64 and BXOR on int64"""
    n = dist.get_world_size()
    out = []
    for op in (dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        o = torch.empty(3, dtype=torch.float64)
        dist.reduce_scatter_tensor(o, randn(dist, 3 * n, salt=1), op=op)
        out.append(o)
    o = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(o, randint(dist, 2 * n, low=0, high=64), op=dist.ReduceOp.BXOR)
    return out + [o]


@case(3)
def reduce_scatter_tensor_three_ranks(dist):
    """reduce_scatter_tensor on an odd number of ranks"""
    out = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, randn(dist, 6))
    return out


@case(4)
def broadcast_from_each_root(dist):
    """broadcast from every root in turn"""
    got = []
    for src in range(dist.get_world_size()):
        x = ramp(dist, 3) + src
        assert dist.broadcast(x, src=src) is None
        got.append(x)
    return got


@case(4)
def barrier_returns_none(dist):
    """barrier, twice"""
    return dist.barrier(), dist.barrier()


@case(4)
def async_collectives_waited(dist):
    """every collective with async_op=True, waited for"""
    n = dist.get_world_size()
    a, g, r, b = randn(dist, 3), torch.empty(2 * n, dtype=torch.float64), torch.empty(2, dtype=torch.float64), ramp(dist, 2)
    lst = [torch.empty(2, dtype=torch.float64) for _ in range(n)]
    works = [dist.all_reduce(a, async_op=True), dist.all_gather_into_tensor(g, randn(dist, 2), async_op=True),
             dist.reduce_scatter_tensor(r, randn(dist, 2 * n, salt=2), async_op=True),
             dist.broadcast(b, src=1, async_op=True), dist.all_gather(lst, randn(dist, 2, salt=3), async_op=True),
             dist.barrier(async_op=True)]
    done = [w.wait() for w in works]
    return a, g, r, b, lst, done


@case(4)
def all_reduce_of_a_leaf_that_requires_grad(dist):
    """all_reduce in place of a leaf tensor that requires grad (torch allows it: no autograd error)"""
    w = randn(dist, 3).requires_grad_()
    dist.all_reduce(w)
    return w.detach()


@case(4)
def all_reduce_of_a_tensor_saved_for_backward(dist):
    """all_reduce in place of a tensor autograd saved: backward then uses the reduced values, on both"""
    a = randn(dist, 3).requires_grad_()
    x = a * 2
    y = x.sin()
    dist.all_reduce(x)
    y.sum().backward()
    return a.grad, x.detach()
