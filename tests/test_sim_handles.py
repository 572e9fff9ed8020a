"""Work handles as strictly as gloo needs them: every handle waited for (UnwaitedWorkError names the line that
issued it), a send or recv handle waited for once and complete only once waited for (WorkError where gloo would
hang), and a handle waited for only by its own rank. Each error also has a corpus case run on gloo
(tests/corpus/handles.py)."""

import pytest
import torch
from sim_helpers import site_in

from puzzles import sim


def site(marker: str) -> str:
    return site_in(__file__, marker)


def assert_mentions(message: str, *parts: str) -> None:
    missing = [p for p in parts if p not in message]
    assert not missing, f"message lacks {missing}:\n{message}"


def test_a_dropped_isend_is_an_error_that_names_its_line():
    def fn(dist):
        x = torch.ones(3, dtype=torch.float64)
        if dist.get_rank() == 0:
            dist.isend(x, 1)  # fire-and-forget
        else:
            dist.recv(x, 0)

    with pytest.raises(sim.UnwaitedWorkError) as info:
        sim.run(fn, 2)
    assert_mentions(str(info.value), "rank 0 returned without calling wait() on the handle of its isend of "
                    "float64[3]", site("fire-and-forget"), "can be lost", "call work.wait()")


@pytest.mark.parametrize("kind", ["irecv", "all_reduce", "batch"])
def test_every_kind_of_dropped_handle_is_an_error(kind):
    def fn(dist):
        r = dist.get_rank()
        x = torch.full((2,), float(r), dtype=torch.float64)
        if kind == "irecv":
            if r == 0:
                dist.send(x, 1)
            else:
                dist.irecv(x, 0)  # dropped-irecv
        elif kind == "all_reduce":
            dist.all_reduce(x, async_op=True)  # dropped-all_reduce
        else:
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 1 - r),  # dropped-batch
                                            dist.P2POp(dist.irecv, torch.empty(2, dtype=torch.float64), 1 - r)])
            works[0].wait()  # the receive's handle is never waited for
        return x

    with pytest.raises(sim.UnwaitedWorkError) as info:
        sim.run(fn, 2)
    assert site(f"dropped-{kind}") in str(info.value)


def test_handles_waited_for_in_any_order_pass():
    def fn(dist):
        r = dist.get_rank()
        got = torch.empty(2, dtype=torch.float64)
        x = torch.full((2,), float(r), dtype=torch.float64)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 1 - r), dist.P2POp(dist.irecv, got, 1 - r)])
        reduce = dist.all_reduce(torch.ones(2, dtype=torch.float64), async_op=True)
        for w in reversed(works):
            w.wait()
        reduce.wait()
        reduce.wait()  # a collective's handle may be waited for again (gloo: fine)
        return got

    assert [g.tolist() for g in sim.run(fn, 2).results] == [[1.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize("batch", [False, True])
def test_waiting_twice_on_a_recv_handle_is_an_error(batch):
    def fn(dist):
        r = dist.get_rank()
        x = torch.ones(2, dtype=torch.float64)
        if batch:
            [w] = dist.batch_isend_irecv([dist.P2POp(dist.isend if r == 0 else dist.irecv, x, 1 - r)])
        else:
            w = dist.isend(x, 1) if r == 0 else dist.irecv(x, 0)
        w.wait()  # first-wait
        w.wait()  # second-wait

    with pytest.raises(sim.WorkError) as info:
        sim.run(fn, 2)
    assert_mentions(str(info.value), "a second time", site("second-wait"), f"first waited for at {site('first-wait')}",
                    "never returns")


def test_a_recv_handle_is_complete_only_once_waited_for_as_on_gloo():
    def fn(dist):
        x = torch.ones(2, dtype=torch.float64)
        w = dist.isend(x, 1) if dist.get_rank() == 0 else dist.irecv(x, 0)
        before = [w.is_completed() for _ in range(3)]
        w.wait()
        return before, w.is_completed()

    assert sim.run(fn, 2).results == [([False] * 3, True)] * 2


def test_polling_a_recv_handle_that_nobody_can_complete_is_an_error_not_a_hang():
    def fn(dist):
        x = torch.ones(2, dtype=torch.float64)
        if dist.get_rank() == 0:
            dist.send(x, 1)
            return
        w = dist.irecv(x, 0)
        while not w.is_completed():  # polls
            pass

    with pytest.raises(sim.WorkError) as info:
        sim.run(fn, 2, timeout=5)
    assert_mentions(str(info.value), "rank 1 polls is_completed()", site("polls"), "call work.wait()")


def test_one_look_at_a_handle_that_nobody_can_complete_yet_is_not_a_loop():
    """A rank that polls a send once and moves on, while no other rank can move (rank 1 waits for it at a barrier
    and posts its recv only after), is no spin: gloo runs it, and so must the simulator (issue 19: p6 answers that
    look at each send once)."""
    def fn(dist):
        x = torch.ones(2, dtype=torch.float64)
        if dist.get_rank() == 1:
            dist.barrier()
            dist.recv(x, 0)
            return x.tolist()
        w = dist.isend(x * 2, 1)
        looked = w.is_completed()  # one look while rank 1 sits in the barrier
        dist.barrier()
        w.wait()
        return looked

    assert sim.run(fn, 2).results == [False, [2.0, 2.0]]


def test_polling_two_handles_in_turn_that_nobody_can_complete_is_an_error_not_a_hang():
    def fn(dist):
        x, y = torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
        if dist.get_rank() == 0:
            dist.send(x, 1)
            return
        works = [dist.irecv(x, 0), dist.irecv(y, 0)]
        while not any(w.is_completed() for w in works):  # spins
            pass

    with pytest.raises(sim.WorkError) as info:
        sim.run(fn, 2, timeout=5)
    assert_mentions(str(info.value), "rank 1 polls is_completed()", site("spins"), "again, with no other call",
                    "call work.wait()")


def test_a_collective_handle_says_complete_once_every_rank_has_arrived():
    def fn(dist):
        x = torch.ones(2, dtype=torch.float64)
        w = dist.all_reduce(x, async_op=True)
        polls = 0
        while not w.is_completed():
            polls += 1
        w.wait()
        return x.tolist()

    assert sim.run(fn, 3).results == [[3.0, 3.0]] * 3


def test_waiting_on_another_ranks_handle_is_refused():
    box = []

    def fn(dist):
        x = torch.ones(2, dtype=torch.float64)
        if dist.get_rank() == 0:
            box.append(dist.all_reduce(x, async_op=True))
            dist.barrier()
            box[0].wait()
        else:
            dist.all_reduce(x, async_op=True).wait()
            dist.barrier()
            box[0].wait()  # not-mine

    with pytest.raises(sim.IsolationError) as info:
        sim.run(fn, 2)
    assert_mentions(str(info.value), "rank 1 called wait()", site("not-mine"), "belongs to rank 0")
