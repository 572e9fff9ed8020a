"""Collectives whose output overlaps their input, against the plain math. gloo reads every input of a collective
before it writes any output (measured: tests/corpus/aliasing.py), so ZeRO's in-place
`reduce_scatter_tensor(inp[r*k:(r+1)*k], inp)` and `all_gather_into_tensor(out, out[r*k:(r+1)*k])` are right
there; they must be right here, for every rank and every position of the overlap."""

import pytest
import torch
from torch.testing import assert_close

from puzzles import sim

SIZES = [2, 3, 4]


def data(rank: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(77 + rank)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def chunk_of(where: str, r: int, n: int) -> int:
    return {"own": r, "first": 0, "last": n - 1, "next": (r + 1) % n}[where]


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["own", "first", "last", "next"])
@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_into_a_chunk_of_its_own_input(n, where, async_op):
    k = 3

    def fn(dist):
        r = dist.get_rank()
        inp = data(r, n * k)
        c = chunk_of(where, r, n)
        work = dist.reduce_scatter_tensor(inp[c * k:(c + 1) * k], inp, async_op=async_op)
        if async_op:
            work.wait()
        return inp

    total = sum(data(r, n * k) for r in range(n))
    for r, inp in enumerate(sim.run(fn, n).results):
        c = chunk_of(where, r, n)
        expected = data(r, n * k)
        expected[c * k:(c + 1) * k] = total[r * k:(r + 1) * k]
        assert_close(inp, expected, rtol=1e-12, atol=1e-12, msg=lambda m: f"rank {r}, chunk {where}: {m}")


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_max_into_its_own_rows(n):
    def fn(dist):
        r = dist.get_rank()
        inp = data(r, 2 * n, 3)
        dist.reduce_scatter_tensor(inp[2 * r:2 * r + 2], inp, op=dist.ReduceOp.MAX)
        return inp[2 * r:2 * r + 2]

    full = torch.stack([data(r, 2 * n, 3) for r in range(n)]).amax(0)
    for r, got in enumerate(sim.run(fn, n).results):
        assert_close(got, full[2 * r:2 * r + 2], rtol=0, atol=0)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["own", "first", "last", "next"])
@pytest.mark.parametrize("n", SIZES)
def test_all_gather_into_tensor_from_a_slot_of_its_own_output(n, where, async_op):
    k = 2

    def fn(dist):
        r = dist.get_rank()
        out = torch.zeros(n * k, dtype=torch.float64)
        c = chunk_of(where, r, n)
        out[c * k:(c + 1) * k] = data(r, k)
        work = dist.all_gather_into_tensor(out, out[c * k:(c + 1) * k], async_op=async_op)
        if async_op:
            work.wait()
        return out

    expected = torch.cat([data(r, k) for r in range(n)])
    for r, out in enumerate(sim.run(fn, n).results):
        assert_close(out, expected, rtol=0, atol=0, msg=lambda m: f"rank {r}, slot {where}: {m}")


@pytest.mark.parametrize("n", SIZES)
def test_all_gather_into_tensor_from_a_window_across_two_slots(n):
    def fn(dist):
        out = torch.zeros(2 * n, dtype=torch.float64)
        out[1:3] = data(dist.get_rank(), 2)
        dist.all_gather_into_tensor(out, out[1:3])
        return out

    for out in sim.run(fn, n).results:
        assert_close(out, torch.cat([data(r, 2) for r in range(n)]), rtol=0, atol=0)


@pytest.mark.parametrize("where", ["own", "first", "last"])
@pytest.mark.parametrize("n", SIZES)
def test_all_gather_from_an_entry_of_its_own_list(n, where):
    def fn(dist):
        r = dist.get_rank()
        out = [torch.zeros(2, dtype=torch.float64) for _ in range(n)]
        c = chunk_of(where, r, n)
        out[c].copy_(data(r, 2))
        dist.all_gather(out, out[c])
        return out

    for out in sim.run(fn, n).results:
        for i in range(n):
            assert_close(out[i], data(i, 2), rtol=0, atol=0)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_and_broadcast_in_place_of_a_view(n, async_op):
    def fn(dist):
        r = dist.get_rank()
        x, y = data(r, 8), data(r, 3, 4)
        works = [dist.all_reduce(x[2:6], async_op=async_op), dist.broadcast(y[1], src=n - 1, async_op=async_op)]
        for w in works if async_op else []:
            w.wait()
        return x, y

    for r, (x, y) in enumerate(sim.run(fn, n).results):
        ex, ey = data(r, 8), data(r, 3, 4)
        ex[2:6] = sum(data(q, 8)[2:6] for q in range(n))
        ey[1] = data(n - 1, 3, 4)[1]
        assert_close(x, ex, rtol=1e-12, atol=1e-12)
        assert_close(y, ey, rtol=0, atol=0)


def test_the_copy_of_an_aliased_input_is_off_the_ledger():
    """The snapshot is the runtime's own memory (as gloo's buffers are): the rank's peak is its input alone."""
    def fn(dist):
        r, n = dist.get_rank(), dist.get_world_size()
        inp = torch.ones(1024 * n, dtype=torch.float64)
        dist.reduce_scatter_tensor(inp[1024 * r:1024 * (r + 1)], inp)
        return None

    result = sim.run(fn, 4)
    assert result.peak_bytes == [4 * 1024 * 8] * 4
