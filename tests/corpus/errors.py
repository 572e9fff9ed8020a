"""Programs that go wrong: collectives that do not match, ranks that return early or raise, a rank's helper
thread calling dist."""

import datetime
import threading

import torch

from puzzles.sim import CollectiveMismatchError, DeadlockError, RankThreadError

from .case import HUNG, RAISED, STRICTER, WRONG, case
from .data import ramp


@case(4, sim=CollectiveMismatchError, gloo={RAISED})
def mismatched_shapes(dist):
    """ranks all_reduce tensors of different shapes (gloo with DETAIL: "Detected mismatch between collectives")"""
    x = torch.ones(3 + dist.get_rank(), dtype=torch.float64)
    dist.all_reduce(x)
    return x


@case(4, sim=CollectiveMismatchError, gloo={RAISED})
def mismatched_dtypes(dist):
    """rank 1 all_reduces float32, the others float64"""
    x = torch.ones(3, dtype=torch.float32 if dist.get_rank() == 1 else torch.float64)
    dist.all_reduce(x)
    return x


@case(4, sim=CollectiveMismatchError, gloo={RAISED})
def mismatched_collectives(dist):
    """rank 0 calls all_reduce, the others broadcast"""
    x = ramp(dist, 3)
    if dist.get_rank() == 0:
        dist.all_reduce(x)
    else:
        dist.broadcast(x, src=0)
    return x


def fixed_mismatched_reduce_ops(dist):
    x = ramp(dist, 3)
    dist.all_reduce(x)
    return x


@case(4, sim=CollectiveMismatchError, gloo={WRONG}, fixed=fixed_mismatched_reduce_ops)
def mismatched_reduce_ops(dist):
    """rank 0 all_reduces with SUM, the others with MAX (DETAIL does not compare ops: gloo computes garbage)"""
    x = ramp(dist, 3)
    dist.all_reduce(x, op=dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX)
    return x


@case(4, sim=CollectiveMismatchError, gloo={HUNG})
def mismatched_broadcast_roots(dist):
    """rank 0 broadcasts from 0, the others from 1"""
    x = ramp(dist, 3)
    dist.broadcast(x, src=0 if dist.get_rank() == 0 else 1)
    return x


@case(4, sim=CollectiveMismatchError, gloo={HUNG})
def sub_group_against_world(dist):
    """rank 0 all_reduces on new_group([0, 1]), rank 1 on WORLD"""
    pair = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))  # gloo's default for a new group: 30 min
    x = ramp(dist, 2)
    if dist.get_rank() == 0:
        dist.all_reduce(x, group=pair)
    else:
        dist.all_reduce(x)
    return x


@case(4, sim=DeadlockError, gloo={HUNG})
def rank_skips_a_collective(dist):
    """rank 1 returns before the all_reduce the others wait in"""
    x = ramp(dist, 2)
    if dist.get_rank() == 1:
        return x
    dist.all_reduce(x)
    return x


@case(4, sim=DeadlockError, gloo={HUNG})
def ranks_call_a_collective_a_different_number_of_times(dist):
    """rank 3 all_reduces once more than the others"""
    x = ramp(dist, 2)
    dist.all_reduce(x)
    if dist.get_rank() == 3:
        dist.all_reduce(x)
    return x


@case(4, sim=ValueError, gloo={RAISED})
def one_rank_raises(dist):
    """rank 2 raises ValueError before the all_reduce"""
    x = ramp(dist, 2)
    if dist.get_rank() == 2:
        raise ValueError("rank 2 gives up")
    dist.all_reduce(x)
    return x


@case(4, sim=ZeroDivisionError, gloo={RAISED})
def every_rank_raises(dist):
    """every rank raises ZeroDivisionError after an all_reduce"""
    x = ramp(dist, 2)
    dist.all_reduce(x)
    return 1 / 0


def fixed_helper_thread(dist):
    x = ramp(dist, 3)
    dist.all_reduce(x)
    return x


@case(4, sim=RankThreadError, relation=STRICTER, fixed=fixed_helper_thread,
      why="torch.distributed is thread-safe, so a thread the rank starts may communicate. The simulator runs each "
          "rank in one thread, watches that thread's ops (memory, isolation, FLOPs) and passes the baton between "
          "rank threads only; it refuses dist calls from any other thread with an error that says so, rather than "
          "lose track of the rank. async_op=True, isend and irecv give the same overlap without threads.")
def helper_thread_calls_dist(dist):
    """the rank starts a thread that all_reduces (swallowing any error), and joins it"""
    x = ramp(dist, 3)
    errors = []

    def reduce():
        try:
            dist.all_reduce(x)
        except Exception as exc:  # what a learner's thread may do: the simulator still reports it
            errors.append(exc)

    t = threading.Thread(target=reduce)
    t.start()
    t.join()
    return x
