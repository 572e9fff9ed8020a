"""Every error of the simulated runtime: its type, a message that names the ranks and the learner's line, and a
quick return that leaves no rank thread behind."""

import os
import threading
import time
import traceback

import pytest
import torch
from sim_helpers import site_in

from puzzles import sim

NOWHERE = torch.ones(3, dtype=torch.float64)  # made at import time: it lives on no rank


def site(marker: str) -> str:
    return site_in(__file__, marker)


@pytest.fixture(autouse=True, scope="module")
def warm_runtime():
    """The first run of a process may import modules torch loads lazily: keep that out of the timed runs."""
    sim.run(lambda dist: torch.zeros(1) + 1, 1)


def rank_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sim-rank")]


def run_expecting(error: type, fn, n: int, **kwargs) -> BaseException:
    """Run `fn` on `n` ranks; check that it raises `error` (rather than hang) and leaves no rank thread. The bound is
    generous: these runs take milliseconds on a quiet machine, and a busy one must not fail them."""
    start = time.monotonic()
    with pytest.raises(error) as info:
        sim.run(fn, n, **kwargs)
    elapsed = time.monotonic() - start
    assert elapsed < 60, f"{error.__name__} took {elapsed:.1f} s to come back"
    assert rank_threads() == [], f"threads left behind: {rank_threads()}"
    return info.value


def assert_mentions(message: str, *parts: str) -> None:
    missing = [p for p in parts if p not in message]
    assert not missing, f"message lacks {missing}:\n{message}"


# ---- deadlocks


def test_deadlock_both_ranks_send_first():
    def fn(dist):
        x = torch.zeros(3, dtype=torch.float64)
        dist.send(x, 1 - dist.get_rank())  # both-send
        dist.recv(x, 1 - dist.get_rank())

    e = run_expecting(sim.DeadlockError, fn, 2)
    assert_mentions(str(e), "rank 0: waits in send of float64[3] to rank 1",
                    "rank 1: waits in send of float64[3] to rank 0", site("both-send"), "ranks 0 and 1 both send first")


def test_deadlock_a_rank_skips_a_collective():
    def fn(dist):
        if dist.get_rank() == 1:
            return  # skips
        dist.all_reduce(torch.zeros(2, dtype=torch.float64))  # skipped-collective

    e = run_expecting(sim.DeadlockError, fn, 3)
    assert_mentions(str(e), "rank 1: has returned", "rank 0: waits in all_reduce", "rank 2: waits in all_reduce",
                    "waiting for ranks [1]", site("skipped-collective"))


def test_deadlock_recv_from_a_rank_that_has_returned():
    def fn(dist):
        if dist.get_rank() == 0:
            dist.recv(torch.empty(4, dtype=torch.float64), src=1)  # recv-from-gone

    e = run_expecting(sim.DeadlockError, fn, 2)
    assert_mentions(str(e), "rank 0: waits in recv into float64[4] from rank 1", site("recv-from-gone"),
                    "rank 1: has returned")


def test_deadlock_wait_on_a_handle_that_can_never_complete():
    def fn(dist):
        buf = torch.empty(2, dtype=torch.float64)
        if dist.get_rank() == 0:
            work = dist.irecv(buf, src=1)  # never-sent
            work.wait()  # hopeless-wait
        else:
            dist.recv(buf, src=0)  # waits-too

    e = run_expecting(sim.DeadlockError, fn, 2)
    assert_mentions(str(e), "rank 0: waits in recv into float64[2] from rank 1", site("never-sent"),
                    f"blocked in wait() at {site('hopeless-wait')}",
                    "rank 1: waits in recv into float64[2] from rank 0", site("waits-too"))


# ---- collectives that do not match


def _mismatch(first, second):
    """fn where rank 0 runs `first(dist)` and rank 1 runs `second(dist)`."""
    return lambda dist: (first if dist.get_rank() == 0 else second)(dist)


@pytest.mark.parametrize("case, rank0, rank1, expected", [
    ("shape",
     lambda d: d.all_reduce(torch.zeros(3, dtype=torch.float64)),  # shape-0
     lambda d: d.all_reduce(torch.zeros(4, dtype=torch.float64)),  # shape-1
     ["tensor=float64[3]", "tensor=float64[4]"]),
    ("dtype",
     lambda d: d.all_reduce(torch.zeros(3, dtype=torch.float64)),  # dtype-0
     lambda d: d.all_reduce(torch.zeros(3, dtype=torch.float32)),  # dtype-1
     ["tensor=float64[3]", "tensor=float32[3]"]),
    ("reduce op",
     lambda d: d.all_reduce(torch.zeros(3, dtype=torch.float64), op=d.ReduceOp.SUM),  # op-0
     lambda d: d.all_reduce(torch.zeros(3, dtype=torch.float64), op=d.ReduceOp.MAX),  # op-1
     ["op=SUM", "op=MAX"]),
    ("collective",
     lambda d: d.all_reduce(torch.zeros(3, dtype=torch.float64)),  # kind-0
     lambda d: d.all_gather([torch.zeros(3, dtype=torch.float64)] * 2, torch.zeros(3, dtype=torch.float64)),  # kind-1
     ["rank 0 called all_reduce", "rank 1 called all_gather"]),
])
def test_collective_mismatch(case, rank0, rank1, expected):
    e = run_expecting(sim.CollectiveMismatchError, _mismatch(rank0, rank1), 2)
    tag = {"shape": "shape", "dtype": "dtype", "reduce op": "op", "collective": "kind"}[case]
    assert_mentions(str(e), "rank 0", "rank 1", *expected, site(f"{tag}-0"), site(f"{tag}-1"))


def test_collective_mismatch_between_a_sub_group_and_world():
    def fn(dist):
        pair = dist.new_group([0, 1])
        x = torch.zeros(2, dtype=torch.float64)
        if dist.get_rank() == 0:
            dist.all_reduce(x, group=pair)  # in-pair
        else:
            dist.all_reduce(x)  # in-world

    e = run_expecting(sim.CollectiveMismatchError, fn, 4)
    assert_mentions(str(e), "rank 0 waits in all_reduce (call #0 on group[0, 1])", site("in-pair"),
                    "rank 1 waits in all_reduce (call #0 on WORLD)", site("in-world"))


# ---- point to point that does not match


@pytest.mark.parametrize("recv_shape, recv_dtype, described", [
    ((4,), torch.float64, "float64[4]"),
    ((3,), torch.float32, "float32[3]"),
])
def test_p2p_mismatch(recv_shape, recv_dtype, described):
    def fn(dist):
        if dist.get_rank() == 0:
            dist.send(torch.zeros(3, dtype=torch.float64), 1)  # mismatched-send
        else:
            dist.recv(torch.empty(recv_shape, dtype=recv_dtype), 0)  # mismatched-recv

    e = run_expecting(sim.P2PMismatchError, fn, 2)
    assert_mentions(str(e), "rank 0 sent a float64[3] tensor", f"rank 1 receives into a {described} tensor",
                    site("mismatched-send"), site("mismatched-recv"))


# ---- isolation


def test_isolation_a_tensor_smuggled_from_another_rank():
    box = []

    def fn(dist):
        if dist.get_rank() == 0:
            box.append(torch.ones(3, dtype=torch.float64))
            dist.barrier()
        else:
            dist.barrier()
            return box[0] * 2  # smuggled

    e = run_expecting(sim.IsolationError, fn, 2)
    assert_mentions(str(e), "rank 1 used a float64[3] tensor that lives on rank 0", "aten.mul", site("smuggled"))


def test_isolation_sending_a_smuggled_tensor():
    box = []

    def fn(dist):
        if dist.get_rank() == 0:
            box.append(torch.ones(3, dtype=torch.float64))
            dist.recv(torch.empty(3, dtype=torch.float64), 1)
        else:
            dist.send(box[0], 0)  # send-smuggled

    e = run_expecting(sim.IsolationError, fn, 2)
    assert_mentions(str(e), "rank 1 used a float64[3] tensor that lives on rank 0, in send", site("send-smuggled"))


def test_isolation_a_module_level_tensor():
    def fn(dist):
        return NOWHERE + dist.get_rank()  # global-tensor

    e = run_expecting(sim.IsolationError, fn, 2)
    assert_mentions(str(e), "rank 0 used a float64[3] tensor that lives on no rank", site("global-tensor"))


def test_isolation_allows_tensors_made_inside_the_rank_from_python_data():
    def fn(dist):
        x = torch.tensor([1.0, 2.0], dtype=torch.float64) * (dist.get_rank() + 1)
        dist.all_reduce(x)
        return x

    for x in sim.run(fn, 2).results:
        assert x.tolist() == [3.0, 6.0]


# ---- the learner's own exception


def test_an_exception_in_one_rank_is_reraised_with_its_rank():
    def fn(dist):
        if dist.get_rank() == 2:
            raise KeyError("no such layer")  # learner-raise
        dist.all_reduce(torch.zeros(2, dtype=torch.float64))

    e = run_expecting(KeyError, fn, 3)
    assert e.args == ("no such layer",)
    assert e.sim_rank == 2
    assert any("rank 2" in note for note in getattr(e, "__notes__", [])), getattr(e, "__notes__", None)
    lines = [f"{os.path.basename(f.filename)}:{f.lineno}: {f.line}" for f in traceback.extract_tb(e.__traceback__)]
    assert site("learner-raise") in lines, f"the traceback lacks the raising line: {lines}"


# ---- time limit


def test_time_limit_stops_an_endless_loop():
    def fn(dist):
        if dist.get_rank() == 1:
            while True: pass  # spin
        dist.barrier()

    e = run_expecting(sim.TimeLimitError, fn, 2, timeout=0.5)  # (the deliberate loop: a short limit)
    assert_mentions(str(e), "rank 1 ran for more than 0.5 s", site("spin"))


def test_time_limit_stops_ranks_that_communicate_forever():
    """A livelock (ranks that keep communicating but never finish) is stopped after ten times the per-rank limit.
    (The limit is 0.3 s, not less: at a load average of 17 a rank between two barriers was once descheduled for
    0.1 s, and the run stopped as a rank that computed too long.)"""
    def fn(dist):
        while True:
            dist.barrier()  # forever

    e = run_expecting(sim.TimeLimitError, fn, 2, timeout=0.3)
    assert_mentions(str(e), "kept communicating for more than 3 s", site("forever"))


# ---- unmatched communication


def test_unmatched_isend_when_every_rank_returns():
    def fn(dist):
        if dist.get_rank() == 0:
            dist.isend(torch.zeros(3, dtype=torch.float64), 1)  # never-received

    e = run_expecting(sim.UnmatchedError, fn, 2)
    assert_mentions(str(e), "send of float64[3] to rank 1", site("never-received"),
                    "rank 1 has posted no matching recv")


def test_unmatched_async_collective_when_every_rank_returns():
    def fn(dist):
        if dist.get_rank() == 0:
            dist.all_reduce(torch.zeros(3, dtype=torch.float64), async_op=True)  # lonely-collective

    e = run_expecting(sim.UnmatchedError, fn, 2)
    assert_mentions(str(e), "ranks [0] entered", site("lonely-collective"), "ranks [1] never did")


# ---- touching a tensor while an async op is in flight


def test_in_flight_reading_an_async_all_reduce_result_before_wait():
    def fn(dist):
        x = torch.ones(4, dtype=torch.float64)
        work = dist.all_reduce(x, async_op=True)  # issued
        y = x * 2  # too-early
        work.wait()
        return y

    e = run_expecting(sim.InFlightError, fn, 2)
    assert_mentions(str(e), "rank 0 read a float64[4] tensor in aten.mul", site("too-early"),
                    f"async all_reduce (issued at {site('issued')})")


def test_in_flight_writing_an_isend_buffer_before_wait():
    def fn(dist):
        x = torch.ones(4, dtype=torch.float64)
        if dist.get_rank() == 0:
            work = dist.isend(x, 1)  # isend-issued
            x.add_(1)  # overwrite
            work.wait()
        else:
            dist.recv(x, 0)

    e = run_expecting(sim.InFlightError, fn, 2)
    assert_mentions(str(e), "rank 0 wrote a float64[4] tensor", site("overwrite"),
                    f"async isend (issued at {site('isend-issued')})")


def test_in_flight_other_slices_of_the_same_storage_are_free_to_use():
    """Bucketing: all-reduce one slice of a flat buffer while the backward pass still fills the next one."""

    def fn(dist):
        r = dist.get_rank()
        flat = torch.zeros(2, 3, dtype=torch.float64)
        flat[0].fill_(r + 1)
        work = dist.all_reduce(flat[0], async_op=True)
        flat[1].fill_(10 * (r + 1))
        peek = flat[1] * 1
        dist.all_reduce(flat[1])
        work.wait()
        return flat, peek

    for r, (flat, peek) in enumerate(sim.run(fn, 2).results):
        torch.testing.assert_close(flat, torch.tensor([[3.0] * 3, [30.0] * 3], dtype=torch.float64))
        torch.testing.assert_close(peek, torch.full((3,), 10.0 * (r + 1), dtype=torch.float64))
    assert rank_threads() == []


def test_a_dropped_send_buffer_is_kept_until_wait():
    """Like a real Work, the handle keeps its tensors alive: dropping the name before wait() frees nothing, so a new
    tensor cannot land on the same memory and be mistaken for the one in flight."""
    def fn(dist):
        if dist.get_rank() == 0:
            dist.barrier()
            y = torch.ones(4, 64, dtype=torch.float64)
            work = dist.isend(y, dst=1)
            del y
            for _ in range(20):
                torch.empty(4, 64, dtype=torch.float64).fill_(2.0)
            work.wait()
            return None
        r = torch.empty(4, 64, dtype=torch.float64)
        handle = dist.irecv(r, src=0)
        dist.barrier()
        handle.wait()
        return r.sum().item()

    assert sim.run(fn, 2).results == [None, 256.0]
