"""Work handles: waited for, waited for twice, polled, dropped. On gloo a dropped isend can vanish (the receiver
hangs: measured, every run), a dropped irecv or async collective leaves its buffer unwritten when the rank reads
it, and a point-to-point handle waited for twice never returns."""

import torch

from puzzles.sim import InFlightError, UnmatchedError, UnwaitedWorkError, WorkError

from .case import HUNG, LOST, RIGHT, WRONG, case
from .data import ramp, randn


@case(4)
def wait_twice_on_an_async_collective(dist):
    """wait() twice on an async all_reduce's handle (fine on gloo)"""
    x = randn(dist, 3)
    w = dist.all_reduce(x, async_op=True)
    return w.wait(), w.wait(), x


@case(4)
def poll_then_wait(dist):
    """is_completed() in a loop, then wait()"""
    x = randn(dist, 3)
    w = dist.all_reduce(x, async_op=True)
    while not w.is_completed():
        pass
    w.wait()
    return x


@case(2, sim=WorkError, gloo={HUNG})
def wait_twice_on_a_recv(dist):
    """wait() twice on an isend's and an irecv's handles (gloo's second wait never returns)"""
    x = ramp(dist, 3)
    w = dist.isend(x, 1) if dist.get_rank() == 0 else dist.irecv(x, 0)
    w.wait()
    w.wait()
    return x


@case(2, sim=WorkError, gloo={HUNG})
def wait_twice_on_batch_handles(dist):
    """wait() twice on every handle batch_isend_irecv returned"""
    peer = 1 - dist.get_rank()
    got = torch.empty(3, dtype=torch.float64)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, ramp(dist, 3), peer), dist.P2POp(dist.irecv, got, peer)])
    for w in works + works:
        w.wait()
    return got


def fixed_dropped_handles(dist):
    x = ramp(dist, 3)
    if dist.get_rank() == 0:
        dist.isend(x, 1).wait()
    else:
        dist.recv(x, 0)
    return x


@case(2, sim=UnwaitedWorkError, gloo={HUNG, RIGHT}, fixed=fixed_dropped_handles)
def dropped_isend(dist):
    """isend whose handle is dropped; the receiver waits (gloo: the message may be lost, the receiver hangs)"""
    x = ramp(dist, 3)
    if dist.get_rank() == 0:
        dist.isend(x, 1)
    else:
        dist.recv(x, 0)
    return x


@case(2, sim=UnwaitedWorkError, gloo={WRONG, RIGHT}, fixed=fixed_dropped_handles)
def dropped_irecv(dist):
    """irecv whose handle is dropped: the rank returns its buffer (gloo: not written yet, as a rule)"""
    x = ramp(dist, 3)
    if dist.get_rank() == 0:
        dist.send(x, 1)
    else:
        dist.irecv(x, 0)
    return x


def fixed_dropped_async_all_reduce(dist):
    x = ramp(dist, 3)
    dist.all_reduce(x)
    return x


@case(4, sim=UnwaitedWorkError, gloo={WRONG, RIGHT}, fixed=fixed_dropped_async_all_reduce)
def dropped_async_all_reduce(dist):
    """async all_reduce whose handle is dropped: the rank returns its buffer"""
    x = ramp(dist, 3)
    dist.all_reduce(x, async_op=True)
    return x


def fixed_dropped_batch_handles(dist):
    r, n = dist.get_rank(), dist.get_world_size()
    got = torch.zeros(3, dtype=torch.float64)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, ramp(dist, 3), (r + 1) % n),
                                     dist.P2POp(dist.irecv, got, (r - 1) % n)]):
        w.wait()
    return got


@case(4, sim=UnwaitedWorkError, gloo={WRONG, RIGHT, HUNG}, fixed=fixed_dropped_batch_handles)
def dropped_batch_handles(dist):
    """batch_isend_irecv whose handles are all dropped"""
    r, n = dist.get_rank(), dist.get_world_size()
    got = torch.zeros(3, dtype=torch.float64)
    dist.batch_isend_irecv([dist.P2POp(dist.isend, ramp(dist, 3), (r + 1) % n),
                            dist.P2POp(dist.irecv, got, (r - 1) % n)])
    return got


@case(2)
def poll_a_recv_then_wait(dist):
    """is_completed() on an isend's and an irecv's handles, three times each, then wait() (gloo says False until
    wait(), however long the data has been there)"""
    x = ramp(dist, 3)
    w = dist.isend(x, 1) if dist.get_rank() == 0 else dist.irecv(x, 0)
    polls = [w.is_completed() for _ in range(3)]
    w.wait()
    return polls, w.is_completed(), x


@case(2)
def poll_a_send_once_while_the_peer_waits(dist):
    """is_completed() once on an isend's handle while the receiver sits in a barrier (its recv comes after), then
    on and wait() later: a look, not a loop"""
    x = ramp(dist, 3)
    if dist.get_rank() == 1:
        dist.barrier()
        dist.recv(x, 0)
        return x
    w = dist.isend(x * 2, 1)
    looked = w.is_completed()
    dist.barrier()
    w.wait()
    return looked, x


@case(2, sim=WorkError, gloo={WRONG, RIGHT}, fixed=fixed_dropped_handles)
def poll_a_recv_instead_of_waiting(dist):
    """polls an irecv's is_completed() (up to 1000 times) instead of waiting, then returns the buffer (a race on
    gloo: the values may or may not have arrived by then)"""
    x = ramp(dist, 3)
    if dist.get_rank() == 0:
        dist.isend(x, 1).wait()
        return x
    w = dist.irecv(x, 0)
    for _ in range(1000):
        if w.is_completed():
            break
    return x


def fixed_read_before_wait(dist):
    x = ramp(dist, 3)
    dist.all_reduce(x)
    return x * 1


@case(4, sim=InFlightError, gloo={WRONG, RIGHT}, fixed=fixed_read_before_wait)
def read_before_wait(dist):
    """reads the buffer of an async all_reduce before wait() (gloo: the values before the reduction, as a rule)"""
    x = ramp(dist, 3)
    w = dist.all_reduce(x, async_op=True)
    y = x * 1
    w.wait()
    return y


@case(2, sim=UnmatchedError, gloo={LOST})
def isend_that_nobody_receives(dist):
    """rank 0 isends and drops the handle; nobody receives (gloo: returns, the message vanishes)"""
    x = ramp(dist, 3)
    if dist.get_rank() == 0:
        dist.isend(x, 1)
    return x
