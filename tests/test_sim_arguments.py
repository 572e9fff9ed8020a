"""What `dist` refuses, as torch.distributed (gloo) refuses it or gets it wrong: non-contiguous tensors where gloo
works on raw memory, reduce ops the dtype cannot take, ops torch does not know; and what it skips, as torch
skips it (a rank outside a group). Each has a corpus case run on gloo (tests/corpus/layouts.py, reduce_ops.py,
groups.py)."""

import pytest
import torch
import torch.distributed as td
from sim_helpers import site_in

from puzzles import sim


def site(marker: str) -> str:
    return site_in(__file__, marker)


def raises(error, fn, n=2):
    with pytest.raises(error) as info:
        sim.run(fn, n)
    return str(info.value)


# ---- non-contiguous tensors


def column(dist):
    return (torch.arange(6, dtype=torch.float64).reshape(3, 2) + 10 * dist.get_rank())[:, 0]


@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "send", "recv", "isend", "irecv", "batch_isend_irecv"])
def test_a_column_is_refused_where_gloo_works_on_raw_memory(op):
    def fn(dist):
        r, t = dist.get_rank(), column(dist)
        if op == "all_reduce":
            dist.all_reduce(t)  # strided-all_reduce
        elif op == "broadcast":
            dist.broadcast(t, src=0)  # strided-broadcast
        elif op in ("send", "recv"):
            if (op == "send") == (r == 0):
                getattr(dist, op)(t, 1 - r)  # strided-send-recv
            else:
                getattr(dist, "recv" if op == "send" else "send")(t.contiguous(), 1 - r)
        elif op in ("isend", "irecv"):
            getattr(dist, op)(t, 1 - r).wait()  # strided-isend-irecv
        else:
            dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1 - r)])  # strided-batch_isend_irecv

    text = raises(sim.NonContiguousError, fn)
    marker = {"send": "send-recv", "recv": "send-recv", "isend": "isend-irecv", "irecv": "isend-irecv"}.get(op, op)
    assert "non-contiguous float64[3] tensor (strides (2,)" in text and site(f"strided-{marker}") in text
    assert "raw memory" in text and "To fix it" in text
    if op in ("all_reduce", "broadcast"):
        assert "wrong elements" in text and "t.copy_(buf)" in text and "`.contiguous()` is a copy" in text


def test_the_remedy_in_the_message_works():
    def fn(dist):
        x = torch.arange(6, dtype=torch.float64).reshape(3, 2) + 10 * dist.get_rank()
        buf = x[:, 0].contiguous()
        dist.all_reduce(buf)
        x[:, 0].copy_(buf)
        return x

    for x in sim.run(fn, 2).results:
        assert x[:, 0].tolist() == [10.0, 14.0, 18.0] and x[:, 1].tolist() != [12.0, 16.0, 20.0]


@pytest.mark.parametrize("call", ["all_gather_into_tensor", "reduce_scatter_tensor", "all_gather"])
def test_strided_tensors_are_refused_in_the_gathers_too_as_nccl_refuses_them(call):
    """gloo copies a strided tensor element by element in these (the corpus' layouts cases show the values right),
    but NCCL refuses every non-contiguous tensor: a pass here must not fail on GPUs."""
    def fn(dist):
        n = dist.get_world_size()
        big = torch.zeros(2 * n, 2, dtype=torch.float64)
        if call == "all_gather_into_tensor":
            dist.all_gather_into_tensor(big[:, 1], column(dist)[:2])
        elif call == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(torch.zeros(2, dtype=torch.float64), big[:, 1])
        else:
            lst = torch.zeros(2, n, dtype=torch.float64)
            dist.all_gather([lst[:, i] for i in range(n)], column(dist)[1:])

    with pytest.raises(sim.NonContiguousError) as info:
        sim.run(fn, 2)
    message = str(info.value)
    assert call in message and "NCCL" in message and "contiguous" in message, message


# ---- reduce ops


@pytest.mark.parametrize("op, dtype, expected", [
    ("BAND", torch.int64, [0b0100, 0b0000]), ("BOR", torch.int64, [0b1110, 0b0111]),
    ("BXOR", torch.int64, [0b1010, 0b0111]), ("BAND", torch.bool, [True, False]),
    ("BOR", torch.bool, [True, True]), ("BXOR", torch.bool, [False, True]),
])
def test_bitwise_reduce_ops(op, dtype, expected):
    values = {torch.int64: [[0b0110, 0b0011], [0b1100, 0b0100]], torch.bool: [[True, True], [True, False]]}[dtype]

    def fn(dist):
        x = torch.tensor(values[dist.get_rank()], dtype=dtype)
        dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
        y = torch.tensor(values[dist.get_rank()], dtype=dtype)
        dist.all_reduce(y, op=getattr(td.ReduceOp, op))  # torch.distributed's own member works the same
        return x.tolist(), y.tolist()

    assert sim.run(fn, 2).results == [(expected, expected)] * 2


@pytest.mark.parametrize("op, dtype, phrase", [
    ("BAND", torch.float64, "bitwise reductions take integer or bool tensors only"),
    ("BXOR", torch.float32, "bitwise reductions take integer or bool tensors only"),
    ("AVG", torch.int64, "Reduce with SUM, then divide in a floating dtype"),
    ("AVG", torch.bool, "the average of integers is not an integer"),
])
def test_reduce_ops_the_dtype_cannot_take_are_refused(op, dtype, phrase):
    def fn(dist):
        dist.all_reduce(torch.ones(2, dtype=dtype), op=getattr(dist.ReduceOp, op))

    text = raises(ValueError, fn)
    assert phrase in text and f"ReduceOp.{op}" in text


def test_reduce_scatter_checks_the_op_too():
    def fn(dist):
        dist.reduce_scatter_tensor(torch.empty(1, dtype=torch.int64), torch.ones(2, dtype=torch.int64),
                                   op=dist.ReduceOp.AVG)

    assert "ReduceOp.AVG" in raises(ValueError, fn)


@pytest.mark.parametrize("op, error, phrase", [
    ("sum", TypeError, "not a str"), (3, TypeError, "not a int"),
    (td.ReduceOp.PREMUL_SUM, ValueError, "ReduceOp.PREMUL_SUM is not supported here"),
])
def test_unknown_reduce_ops_are_refused_naming_the_supported_ones(op, error, phrase):
    text = raises(error, lambda dist: dist.all_reduce(torch.ones(2, dtype=torch.float64), op=op))
    assert phrase in text and "SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR" in text


def test_avg_of_floats_is_the_mean():
    def fn(dist):
        x = torch.full((2,), float(dist.get_rank()), dtype=torch.float32)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        return x.tolist()

    assert sim.run(fn, 4).results == [[1.5, 1.5]] * 4


# ---- ranks outside a group


def test_a_rank_outside_a_group_skips_its_calls_as_in_torch():
    def fn(dist):
        g = dist.new_group([0, 1])
        x = torch.full((2,), float(dist.get_rank()), dtype=torch.float64)
        results = [dist.all_reduce(x, group=g), dist.broadcast(x, src=0, group=g), dist.barrier(group=g)]
        if dist.get_rank() == 2:
            results += [dist.isend(x, 0, group=g), dist.irecv(x, 0, group=g), dist.recv(x, 0, group=g)]
        return x.tolist(), results

    result = sim.run(fn, 3)
    assert result.results == [([1.0, 1.0], [None] * 3)] * 2 + [([2.0, 2.0], [None] * 5 + [-1])]
    assert any("NON_GROUP_MEMBER" in w and "skipped" in w for w in result.warnings)


def test_a_blocking_send_outside_the_group_raises_as_in_torch():
    def fn(dist):
        g = dist.new_group([0, 1])
        if dist.get_rank() == 2:
            dist.send(torch.ones(1), 0, group=g)  # outsider

    text = raises(ValueError, fn, 3)
    assert "Invalid process group specified" in text and site("outsider") in text
