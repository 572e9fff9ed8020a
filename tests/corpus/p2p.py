"""Point to point: send/recv, isend/irecv, batch_isend_irecv, tags, src=None, buffers that do not match the
message, and orders that deadlock."""

import torch

from puzzles.sim import DeadlockError, P2PMismatchError

from .case import DIED, HUNG, RAISED, STRICTER, WRONG, case
from .data import ramp, randn


@case(4)
def send_recv_ring(dist):
    """blocking send/recv around a ring, even ranks sending first"""
    r, n = dist.get_rank(), dist.get_world_size()
    mine, got = randn(dist, 3), torch.empty(3, dtype=torch.float64)
    if r % 2 == 0:
        dist.send(mine, (r + 1) % n)
        src = dist.recv(got, (r - 1) % n)
    else:
        src = dist.recv(got, (r - 1) % n)
        dist.send(mine, (r + 1) % n)
    return got, src


@case(4)
def isend_irecv_ring(dist):
    """isend/irecv around a ring, both waited for"""
    r, n = dist.get_rank(), dist.get_world_size()
    got = torch.empty(2, 2, dtype=torch.float64)
    works = [dist.isend(randn(dist, 2, 2), (r + 1) % n), dist.irecv(got, (r - 1) % n)]
    for w in works:
        w.wait()
    return got


@case(4)
def batch_isend_irecv_both_directions(dist):
    """batch_isend_irecv with each neighbour, both directions at once (1F1B's exchange)"""
    r, n = dist.get_rank(), dist.get_world_size()
    left, right = torch.empty(3, dtype=torch.float64), torch.empty(3, dtype=torch.float64)
    ops = [dist.P2POp(dist.isend, randn(dist, 3, salt=1), (r + 1) % n),
           dist.P2POp(dist.isend, randn(dist, 3, salt=2), (r - 1) % n),
           dist.P2POp(dist.irecv, left, (r - 1) % n), dist.P2POp(dist.irecv, right, (r + 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return left, right


@case(4)
def recv_from_any_source(dist):
    """recv(src=None) returns the sender's rank"""
    r = dist.get_rank()
    x = ramp(dist, 3)
    if r == 2:
        dist.send(x, 0)
    elif r == 0:
        return dist.recv(x), x
    return None


@case(4)
def irecv_from_any_source(dist):
    """irecv(src=None), waited for: the handle knows the source"""
    r = dist.get_rank()
    x = ramp(dist, 3)
    if r == 3:
        dist.send(x, 1)
    elif r == 1:
        w = dist.irecv(x)
        w.wait()
        return w._source_rank(), x
    return None


@case(2)
def tags_received_out_of_order(dist):
    """two messages with tags 1 and 2, received in the other order"""
    a, b = ramp(dist, 2), ramp(dist, 2) + 10
    if dist.get_rank() == 0:
        works = [dist.isend(a, 1, tag=1), dist.isend(b, 1, tag=2)]
    else:
        works = [dist.irecv(b, 0, tag=2), dist.irecv(a, 0, tag=1)]
    for w in works:
        w.wait()
    return a, b


@case(4)
def send_recv_by_group_rank(dist):
    """send/recv on a sub-group, naming the peers by group rank (group_dst, group_src)"""
    g = dist.new_group([1, 3])
    r = dist.get_rank()
    x = ramp(dist, 2)
    if r == 1:
        dist.send(x, group=g, group_dst=1)
    elif r == 3:
        dist.recv(x, group=g, group_src=0)
    return x


@case(2)
def send_recv_int64_and_bool(dist):
    """send/recv of int64 and bool tensors"""
    n, b = torch.arange(5) * (dist.get_rank() + 1), torch.tensor([dist.get_rank() == 0, False])
    if dist.get_rank() == 0:
        dist.send(n, 1)
        dist.send(b, 1)
    else:
        dist.recv(n, 0)
        dist.recv(b, 0)
    return n, b


def fixed_recv_into_another_dtype(dist):
    if dist.get_rank() == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), 1)
        return None
    y = torch.zeros(3, dtype=torch.float64)
    dist.recv(y, 0)
    return y.float()


@case(2, sim=P2PMismatchError, gloo={WRONG}, fixed=fixed_recv_into_another_dtype)
def recv_into_another_dtype(dist):
    """send float64[3], recv into float32[6] (the same bytes: gloo reinterprets them)"""
    if dist.get_rank() == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), 1)
        return None
    y = torch.zeros(6, dtype=torch.float32)
    dist.recv(y, 0)
    return y[:3]


def fixed_recv_into_a_bigger_buffer(dist):
    if dist.get_rank() == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), 1)
        return None
    y = torch.zeros(4, dtype=torch.float64)
    dist.recv(y[:3], 0)
    return y


@case(2, sim=P2PMismatchError, relation=STRICTER, fixed=fixed_recv_into_a_bigger_buffer,
      why="gloo fills the first 3 elements of a 4-element receive buffer and says nothing. The simulator asks for "
          "a buffer of the sender's shape and dtype: a size that differs is nearly always a bug (a wrong micro-"
          "batch shape) that the next message, or a smaller buffer (gloo then kills the process), would reveal.")
def recv_into_a_bigger_buffer(dist):
    """send float64[3], recv into float64[4] (gloo fills a prefix)"""
    if dist.get_rank() == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), 1)
        return None
    y = torch.zeros(4, dtype=torch.float64)
    dist.recv(y, 0)
    return y


@case(2, sim=P2PMismatchError, gloo={DIED, HUNG})
def recv_into_a_smaller_buffer(dist):
    """send float64[3], recv into float64[2] (gloo aborts the receiving process)"""
    if dist.get_rank() == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), 1)
        return None
    y = torch.zeros(2, dtype=torch.float64)
    dist.recv(y, 0)
    return y


@case(2, sim=ValueError, gloo={RAISED})
def send_to_itself(dist):
    """a rank sends to itself (both: "destination rank should not be the same")"""
    x = ramp(dist, 2)
    if dist.get_rank() == 0:
        dist.send(x, 0)
    return x


@case(2, sim=DeadlockError, gloo={HUNG})
def both_ranks_send_first(dist):
    """both ranks send before they receive (a blocking send waits for its recv, on gloo too)"""
    peer = 1 - dist.get_rank()
    x, y = ramp(dist, 3), torch.empty(3, dtype=torch.float64)
    dist.send(x, peer)
    dist.recv(y, peer)
    return y


@case(2, sim=DeadlockError, gloo={HUNG})
def tags_that_do_not_match(dist):
    """send with tag 1, recv with tag 2"""
    x = ramp(dist, 2)
    if dist.get_rank() == 0:
        dist.send(x, 1, tag=1)
    else:
        dist.recv(x, 0, tag=2)
    return x


@case(4, sim=DeadlockError, gloo={HUNG})
def recv_from_a_rank_that_returned(dist):
    """rank 0 waits for a message that rank 1 never sends"""
    x = ramp(dist, 2)
    if dist.get_rank() == 0:
        dist.recv(x, 1)
    return x


@case(2, sim=IndexError, gloo={RAISED})
def batch_isend_irecv_empty(dist):
    """batch_isend_irecv([]): torch reads the first op's group first (IndexError)"""
    dist.batch_isend_irecv([])
    return torch.zeros(1)
