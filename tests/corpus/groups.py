"""Sub-groups made by new_group: collectives inside them, members and non-members, group ranks."""

import torch

from .case import RAISED, case
from .data import ramp, randn


@case(4)
def sub_group_all_reduce(dist):
    """all_reduce on new_group([0, 2]) by its members; the others skip it"""
    g = dist.new_group([0, 2])
    x = randn(dist, 3)
    if dist.get_rank() in (0, 2):
        dist.all_reduce(x, group=g)
    return x


@case(4)
def parity_groups_gather_and_scatter(dist):
    """even and odd ranks in two groups: all_gather_into_tensor and reduce_scatter_tensor in each"""
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    g = groups[dist.get_rank() % 2]
    full = torch.empty(4, dtype=torch.float64)
    dist.all_gather_into_tensor(full, randn(dist, 2), group=g)
    part = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(part, randn(dist, 4, salt=5), group=g)
    return full, part


@case(4)
def group_ranks_and_sizes(dist):
    """get_rank, get_world_size, get_process_group_ranks, get_global_rank, get_group_rank on new_group([3, 1])"""
    g = dist.new_group([3, 1])
    r = dist.get_rank()
    if r not in (1, 3):
        return dist.get_rank(g), dist.get_world_size(g)
    return (dist.get_rank(g), dist.get_world_size(g), dist.get_process_group_ranks(g), dist.get_global_rank(g, 1),
            dist.get_group_rank(g, 3))


@case(4)
def non_member_calls_are_skipped(dist):
    """non-members call all_reduce, broadcast, isend and recv with the group new_group gave them: nothing
    happens (isend returns None, recv -1)"""
    g = dist.new_group([0, 1])
    x = ramp(dist, 2)
    dist.all_reduce(x, group=g)
    dist.broadcast(x, src=1, group=g)
    if dist.get_rank() >= 2:
        return x, dist.isend(x, 0, group=g), dist.recv(x, 1, group=g)
    return x


@case(4, sim=ValueError, gloo={RAISED})
def non_member_send_raises(dist):
    """a non-member calls the blocking send with its group (torch: "Invalid process group specified")"""
    g = dist.new_group([0, 1])
    x = ramp(dist, 2)
    if dist.get_rank() == 3:
        dist.send(x, 0, group=g)
    return x


@case(4)
def sub_group_broadcast_by_global_and_group_rank(dist):
    """broadcast in new_group([1, 2, 3]) from global rank 3, then from group rank 0"""
    g = dist.new_group([1, 2, 3])
    x, y = ramp(dist, 2), ramp(dist, 2) + 0.5
    if dist.get_rank() != 0:
        dist.broadcast(x, src=3, group=g)
        dist.broadcast(y, group=g, group_src=0)
    return x, y


@case(4)
def sub_group_async_and_barrier(dist):
    """async all_reduce and a barrier in a sub-group, a world all_reduce between"""
    g = dist.new_group([1, 2])
    x, y = randn(dist, 2), randn(dist, 2, salt=1)
    w = dist.all_reduce(x, group=g, async_op=True) if dist.get_rank() in (1, 2) else None
    dist.all_reduce(y)
    if w is not None:
        w.wait()
        dist.barrier(group=g)
    return x, y


@case(4)
def process_group_queries(dist):
    """is_available, is_initialized, get_rank and get_world_size of WORLD, group.WORLD's size"""
    return (dist.is_available(), dist.is_initialized(), dist.get_rank(), dist.get_world_size(),
            dist.get_world_size(dist.group.WORLD))
