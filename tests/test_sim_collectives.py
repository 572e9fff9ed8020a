"""Every communication primitive of the simulated runtime against the plain math, for several world sizes.

Each rank makes its input from its rank number (`data`), so the test can compute the expected value with
ordinary torch ops in the caller.
"""

import pytest
import torch
from torch.testing import assert_close

from puzzles import sim

SIZES = [1, 2, 3, 4, 8]
MULTI = [2, 3, 4, 8]


def data(rank: int, *shape: int, salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s input: random float64 values, the same wherever it is made."""
    g = torch.Generator().manual_seed(1000 * rank + salt)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def parity_groups(dist):
    """Make the even-rank and the odd-rank groups (every rank calls new_group for both, in the same order);
    return the calling rank's group."""
    n = dist.get_world_size()
    groups = [dist.new_group(list(range(p, n, 2))) for p in (0, 1) if p < n]
    return groups[dist.get_rank() % 2]


def members(n: int, rank: int) -> list[int]:
    return list(range(rank % 2, n, 2))


@pytest.mark.parametrize("n", SIZES)
def test_rank_and_world_size(n):
    result = sim.run(lambda dist: (dist.get_rank(), dist.get_world_size()), n)
    assert result.results == [(r, n) for r in range(n)]


@pytest.mark.parametrize("n", MULTI)
def test_send_recv_ring(n):
    def fn(dist):
        r = dist.get_rank()
        x, buf = data(r, 3, 2), torch.empty(3, 2, dtype=torch.float64)
        if r % 2 == 0:
            sent = dist.send(x, (r + 1) % n)
            src = dist.recv(buf, (r - 1) % n)
        else:
            src = dist.recv(buf, (r - 1) % n)
            sent = dist.send(x, (r + 1) % n)
        return sent, src, buf

    for r, (sent, src, buf) in enumerate(sim.run(fn, n).results):
        assert sent is None, f"send returned {sent!r} on rank {r}"
        assert src == (r - 1) % n, f"recv on rank {r} returned {src!r}"
        assert_close(buf, data((r - 1) % n, 3, 2), rtol=0, atol=0)


@pytest.mark.parametrize("n", MULTI)
def test_recv_from_any_source_returns_the_sender(n):
    def fn(dist):
        r = dist.get_rank()
        if r != 0:
            dist.send(data(r, 4), 0)
            return None
        got = []
        for _ in range(n - 1):
            buf = torch.empty(4, dtype=torch.float64)
            src = dist.recv(buf, src=None)
            got.append((src, buf))
        return got

    got = sim.run(fn, n).results[0]
    assert sorted(src for src, _ in got) == list(range(1, n)), f"senders reported: {[s for s, _ in got]}"
    for src, buf in got:
        assert_close(buf, data(src, 4), rtol=0, atol=0, msg=f"buffer reported as coming from rank {src}")


@pytest.mark.parametrize("n", MULTI)
def test_isend_irecv(n):
    def fn(dist):
        r = dist.get_rank()
        x, buf = data(r, 5), torch.empty(5, dtype=torch.float64)
        works = [dist.isend(x, (r + 1) % n), dist.irecv(buf, (r - 1) % n)]
        assert all(isinstance(w, sim.Work) for w in works), works
        waited = [w.wait() for w in works]
        return waited, [w.is_completed() for w in works], works[1].source_rank(), buf

    for r, (waited, completed, src, buf) in enumerate(sim.run(fn, n).results):
        assert waited == [True, True] and completed == [True, True], (r, waited, completed)
        assert src == (r - 1) % n
        assert_close(buf, data((r - 1) % n, 5), rtol=0, atol=0)


@pytest.mark.parametrize("n", MULTI)
def test_batch_isend_irecv_both_directions(n):
    def fn(dist):
        r = dist.get_rank()
        nxt, prv = (r + 1) % n, (r - 1) % n
        from_prev, from_next = torch.empty(2, 3, dtype=torch.float64), torch.empty(2, 3, dtype=torch.float64)
        ops = [dist.P2POp(dist.isend, data(r, 2, 3, salt=1), nxt), dist.P2POp(dist.isend, data(r, 2, 3, salt=2), prv),
               dist.P2POp(dist.irecv, from_prev, prv), dist.P2POp(dist.irecv, from_next, nxt)]
        works = dist.batch_isend_irecv(ops)
        for w in works:
            w.wait()
        return len(works), from_prev, from_next

    for r, (count, from_prev, from_next) in enumerate(sim.run(fn, n).results):
        assert count == 4
        assert_close(from_prev, data((r - 1) % n, 2, 3, salt=1), rtol=0, atol=0)
        assert_close(from_next, data((r + 1) % n, 2, 3, salt=2), rtol=0, atol=0)


REDUCTIONS = {
    "SUM": lambda s: s.sum(0),
    "AVG": lambda s: s.mean(0),
    "MAX": lambda s: s.amax(0),
    "MIN": lambda s: s.amin(0),
    "PRODUCT": lambda s: s.prod(0),
}


@pytest.mark.parametrize("op", list(REDUCTIONS))
@pytest.mark.parametrize("n", SIZES)
def test_all_reduce(n, op):
    def fn(dist):
        x = data(dist.get_rank(), 3, 4)
        returned = dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
        return returned, x

    expected = REDUCTIONS[op](torch.stack([data(r, 3, 4) for r in range(n)]))
    for r, (returned, x) in enumerate(sim.run(fn, n).results):
        assert returned is None, f"all_reduce returned {returned!r}; a sync op returns None"
        assert_close(x, expected, msg=lambda m: f"rank {r}, {op}: {m}")


@pytest.mark.parametrize("n", SIZES)
def test_all_gather(n):
    def fn(dist):
        out = [torch.empty(2, 3, dtype=torch.float64) for _ in range(n)]
        return dist.all_gather(out, data(dist.get_rank(), 2, 3)), out

    for returned, out in sim.run(fn, n).results:
        assert returned is None
        for i in range(n):
            assert_close(out[i], data(i, 2, 3), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["concatenated", "stacked"])
@pytest.mark.parametrize("n", SIZES)
def test_all_gather_into_tensor(n, layout):
    shape = (n * 2, 3) if layout == "concatenated" else (n, 2, 3)
    combine = torch.cat if layout == "concatenated" else torch.stack

    def fn(dist):
        out = torch.empty(*shape, dtype=torch.float64)
        return dist.all_gather_into_tensor(out, data(dist.get_rank(), 2, 3)), out

    expected = combine([data(r, 2, 3) for r in range(n)])
    for returned, out in sim.run(fn, n).results:
        assert returned is None
        assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX"])
@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_tensor(n, op):
    def fn(dist):
        out = torch.empty(2, 3, dtype=torch.float64)
        returned = dist.reduce_scatter_tensor(out, data(dist.get_rank(), n * 2, 3), op=getattr(dist.ReduceOp, op))
        return returned, out

    full = REDUCTIONS[op](torch.stack([data(r, n * 2, 3) for r in range(n)]))
    for r, (returned, out) in enumerate(sim.run(fn, n).results):
        assert returned is None
        assert_close(out, full[2 * r:2 * r + 2], msg=lambda m: f"rank {r}: {m}")


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_from_every_root(n):
    def fn(dist):
        got = []
        for src in range(n):
            x = data(dist.get_rank(), 4, salt=src)
            assert dist.broadcast(x, src=src) is None
            got.append(x)
        return got

    for r, got in enumerate(sim.run(fn, n).results):
        for src in range(n):
            assert_close(got[src], data(src, 4, salt=src), rtol=0, atol=0, msg=f"rank {r}, root {src}")


@pytest.mark.parametrize("n", SIZES)
def test_barrier_returns_none(n):
    assert sim.run(lambda dist: dist.barrier(), n).results == [None] * n


def _issue_async(dist, kind: str):
    """Issue one async collective; return (work, a function giving what the rank ends with, the expected value)."""
    r, n = dist.get_rank(), dist.get_world_size()
    if kind == "all_reduce":
        x = data(r, 3)
        return dist.all_reduce(x, async_op=True), lambda: x
    if kind == "all_gather":
        out = [torch.empty(3, dtype=torch.float64) for _ in range(n)]
        return dist.all_gather(out, data(r, 3), async_op=True), lambda: torch.stack(out)
    if kind == "all_gather_into_tensor":
        out = torch.empty(n * 3, dtype=torch.float64)
        return dist.all_gather_into_tensor(out, data(r, 3), async_op=True), lambda: out
    if kind == "reduce_scatter_tensor":
        out = torch.empty(3, dtype=torch.float64)
        return dist.reduce_scatter_tensor(out, data(r, n * 3), async_op=True), lambda: out
    if kind == "broadcast":
        x = data(r, 3)
        return dist.broadcast(x, src=0, async_op=True), lambda: x
    return dist.barrier(async_op=True), lambda: None


def _expected_async(kind: str, n: int, r: int):
    if kind == "all_reduce":
        return sum(data(i, 3) for i in range(n))
    if kind == "all_gather":
        return torch.stack([data(i, 3) for i in range(n)])
    if kind == "all_gather_into_tensor":
        return torch.cat([data(i, 3) for i in range(n)])
    if kind == "reduce_scatter_tensor":
        return sum(data(i, n * 3) for i in range(n))[3 * r:3 * r + 3]
    if kind == "broadcast":
        return data(0, 3)
    return None


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
                                  "broadcast", "barrier"])
@pytest.mark.parametrize("n", [1, 3])
def test_async_collectives_return_a_work_to_wait_on(n, kind):
    def fn(dist):
        work, result = _issue_async(dist, kind)
        assert isinstance(work, sim.Work), f"async_op=True returned {work!r}"
        waited = work.wait()
        return waited, work.is_completed(), result()

    for r, (waited, completed, got) in enumerate(sim.run(fn, n).results):
        assert waited is True and completed is True, (r, waited, completed)
        expected = _expected_async(kind, n, r)
        if expected is None:
            assert got is None
        else:
            assert_close(got, expected, msg=lambda m: f"{kind} rank {r}: {m}")


def test_is_completed_is_false_until_every_participant_has_arrived():
    def fn(dist):
        token = torch.zeros(1, dtype=torch.float64)
        x = data(dist.get_rank(), 3)
        if dist.get_rank() == 0:
            work = dist.all_reduce(x, async_op=True)
            before = work.is_completed()  # rank 1 is still waiting for the token: it has not joined
            dist.send(token, 1)
            work.wait()
            return before, work.is_completed(), x
        dist.recv(token, 0)
        dist.all_reduce(x)
        return None, None, x

    (before, after, x0), (_, _, x1) = sim.run(fn, 2).results
    assert (before, after) == (False, True)
    assert_close(x0, data(0, 3) + data(1, 3))
    assert_close(x1, x0, rtol=0, atol=0)


@pytest.mark.parametrize("n", SIZES)
def test_new_group_rank_and_size(n):
    def fn(dist):
        g = parity_groups(dist)
        only0 = dist.new_group([0])
        outside = only0 is dist.GroupMember.NON_GROUP_MEMBER
        return dist.get_rank(g), dist.get_world_size(g), outside, dist.get_rank(only0), dist.get_world_size(only0)

    for r, (grank, gsize, outside, rank0, size0) in enumerate(sim.run(fn, n).results):
        mine = members(n, r)
        assert (grank, gsize) == (mine.index(r), len(mine)), (r, grank, gsize)
        assert outside == (r != 0), f"rank {r}: new_group([0]) returned the group: {not outside}"
        assert (rank0, size0) == ((0, 1) if r == 0 else (-1, -1)), (r, rank0, size0)  # -1: not a member


@pytest.mark.parametrize("op", ["SUM", "MAX"])
@pytest.mark.parametrize("n", SIZES)
def test_sub_group_all_reduce(n, op):
    def fn(dist):
        g = parity_groups(dist)
        x = data(dist.get_rank(), 3)
        dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=g)
        return x

    for r, x in enumerate(sim.run(fn, n).results):
        expected = REDUCTIONS[op](torch.stack([data(m, 3) for m in members(n, r)]))
        assert_close(x, expected, msg=lambda m: f"rank {r}: {m}")


@pytest.mark.parametrize("n", SIZES)
def test_sub_group_gathers_and_scatters(n):
    def fn(dist):
        g = parity_groups(dist)
        r, k = dist.get_rank(), dist.get_world_size(g)
        as_list = [torch.empty(2, dtype=torch.float64) for _ in range(k)]
        dist.all_gather(as_list, data(r, 2), group=g)
        cat, stacked = torch.empty(2 * k, dtype=torch.float64), torch.empty(k, 2, dtype=torch.float64)
        dist.all_gather_into_tensor(cat, data(r, 2), group=g)
        dist.all_gather_into_tensor(stacked, data(r, 2), group=g)
        scattered = torch.empty(2, dtype=torch.float64)
        dist.reduce_scatter_tensor(scattered, data(r, 2 * k, salt=1), group=g)
        root = dist.get_process_group_ranks(g)[-1]
        broadcast = data(r, 2, salt=2)
        dist.broadcast(broadcast, src=root, group=g)
        dist.barrier(group=g)
        return torch.stack(as_list), cat, stacked, scattered, broadcast

    for r, (as_list, cat, stacked, scattered, broadcast) in enumerate(sim.run(fn, n).results):
        mine = members(n, r)
        gathered = torch.stack([data(m, 2) for m in mine])
        assert_close(as_list, gathered, rtol=0, atol=0)
        assert_close(cat, gathered.reshape(-1), rtol=0, atol=0)
        assert_close(stacked, gathered, rtol=0, atol=0)
        i = mine.index(r)
        assert_close(scattered, sum(data(m, 2 * len(mine), salt=1) for m in mine)[2 * i:2 * i + 2])
        assert_close(broadcast, data(mine[-1], 2, salt=2), rtol=0, atol=0)


@pytest.mark.parametrize("n", [4, 8])
def test_sub_group_point_to_point(n):
    """Within a group, peers are global ranks (dst/src) or group ranks (group_dst/group_src)."""

    def fn(dist):
        g = parity_groups(dist)
        mine = dist.get_process_group_ranks(g)
        i, k = dist.get_rank(g), dist.get_world_size(g)
        buf = torch.empty(3, dtype=torch.float64)
        if i % 2 == 0:
            dist.send(data(dist.get_rank(), 3), dst=mine[(i + 1) % k], group=g)
            src = dist.recv(buf, group=g, group_src=(i - 1) % k)
        else:
            src = dist.recv(buf, src=mine[(i - 1) % k], group=g)
            dist.send(data(dist.get_rank(), 3), group=g, group_dst=(i + 1) % k)
        return src, buf

    for r, (src, buf) in enumerate(sim.run(fn, n).results):
        mine = members(n, r)
        prev = mine[(mine.index(r) - 1) % len(mine)]
        assert src == prev, f"rank {r}: recv reported {src}, expected {prev}"
        assert_close(buf, data(prev, 3), rtol=0, atol=0)


@pytest.mark.parametrize("n", [4, 8])
def test_sub_group_batch_isend_irecv(n):
    def fn(dist):
        g = parity_groups(dist)
        mine = dist.get_process_group_ranks(g)
        i, k = dist.get_rank(g), dist.get_world_size(g)
        buf = torch.empty(3, dtype=torch.float64)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, data(dist.get_rank(), 3), mine[(i + 1) % k], group=g),
                                        dist.P2POp(dist.irecv, buf, mine[(i - 1) % k], group=g)])
        for w in works:
            w.wait()
        return buf

    for r, buf in enumerate(sim.run(fn, n).results):
        mine = members(n, r)
        assert_close(buf, data(mine[(mine.index(r) - 1) % len(mine)], 3), rtol=0, atol=0)


def test_torch_distributed_reduce_ops_are_accepted():
    """A learner may write torch.distributed.ReduceOp.MAX: the same fn then runs on real process groups."""
    import torch.distributed

    def fn(dist):
        x = data(dist.get_rank(), 3)
        dist.all_reduce(x, op=torch.distributed.ReduceOp.MAX)
        return x

    for x in sim.run(fn, 3).results:
        assert_close(x, torch.stack([data(r, 3) for r in range(3)]).amax(0), rtol=0, atol=0)


def test_rank_args_give_each_rank_its_own_inputs():
    shards = [(data(r, 2, salt=9),) for r in range(3)]
    shared = data(7, 2)

    def fn(dist, w, shard):
        dist.all_reduce(shard)
        return shard * w

    for r, out in enumerate(sim.run(fn, 3, args=(shared,), rank_args=shards).results):
        assert_close(out, sum(s for (s,) in shards) * shared)
