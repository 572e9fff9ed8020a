"""Buffers that overlap: an output that is (a view of) the input, an input that is a slot of the output, in-place
ops on views, and one buffer handed to two ops at once. gloo reads every input of a collective before it writes
any output; the simulator must too."""

import torch

from puzzles.sim import InFlightError

from .case import RIGHT, WRONG, case
from .data import ramp, randn


@case(4)
def reduce_scatter_output_is_own_chunk_of_input(dist):
    """reduce_scatter_tensor(out, inp) with out = this rank's chunk of inp (ZeRO's in-place idiom)"""
    r, n = dist.get_rank(), dist.get_world_size()
    inp = randn(dist, 3 * n)
    dist.reduce_scatter_tensor(inp[3 * r:3 * r + 3], inp)
    return inp


@case(4)
def reduce_scatter_output_is_first_chunk_of_input(dist):
    """reduce_scatter_tensor(out, inp) with out = chunk 0 of inp on every rank (another rank's chunk)"""
    n = dist.get_world_size()
    inp = ramp(dist, 2 * n)
    dist.reduce_scatter_tensor(inp[:2], inp)
    return inp


@case(4)
def reduce_scatter_output_is_own_rows_async(dist):
    """async reduce_scatter_tensor of [N*2, 3] into this rank's own two rows, waited for"""
    r, n = dist.get_rank(), dist.get_world_size()
    inp = randn(dist, 2 * n, 3)
    dist.reduce_scatter_tensor(inp[2 * r:2 * r + 2], inp, async_op=True).wait()
    return inp


@case(4)
def all_gather_into_tensor_input_is_own_slot(dist):
    """all_gather_into_tensor(out, out[r*k:(r+1)*k]): the input is this rank's slot of the output"""
    r, n = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(3 * n, dtype=torch.float64)
    out[3 * r:3 * r + 3] = randn(dist, 3)
    dist.all_gather_into_tensor(out, out[3 * r:3 * r + 3])
    return out


@case(4)
def all_gather_into_tensor_input_is_first_slot(dist):
    """all_gather_into_tensor(out, out[:k]) on every rank: the input sits in another rank's slot"""
    n = dist.get_world_size()
    out = torch.zeros(3 * n, dtype=torch.float64)
    out[:3] = randn(dist, 3)
    dist.all_gather_into_tensor(out, out[:3])
    return out


@case(4)
def all_gather_into_tensor_input_is_last_slot_async(dist):
    """async all_gather_into_tensor(out, out[-k:]), waited for"""
    n = dist.get_world_size()
    out = torch.zeros(2 * n, 2, dtype=torch.float64)
    out[-2:] = randn(dist, 2, 2)
    dist.all_gather_into_tensor(out, out[-2:], async_op=True).wait()
    return out


@case(4)
def all_gather_list_input_is_own_entry(dist):
    """all_gather(out, out[r]): the input is this rank's own entry of the list"""
    r, n = dist.get_rank(), dist.get_world_size()
    flat = torch.zeros(n, 2, dtype=torch.float64)
    flat[r] = randn(dist, 2)
    dist.all_gather(list(flat.unbind(0)), flat[r])
    return flat


@case(4)
def all_gather_list_input_is_first_entry(dist):
    """all_gather(out, out[0]) on every rank: the input is another rank's entry"""
    n = dist.get_world_size()
    out = [torch.zeros(2, dtype=torch.float64) for _ in range(n)]
    out[0].copy_(randn(dist, 2))
    dist.all_gather(out, out[0])
    return out


@case(4)
def all_reduce_in_place_of_a_slice(dist):
    """all_reduce of a contiguous slice x[2:6], in place: the rest of x is untouched"""
    x = ramp(dist, 8)
    dist.all_reduce(x[2:6])
    return x


@case(4)
def all_reduce_async_of_two_slices_of_one_buffer(dist):
    """two async all_reduces of two halves of one flat buffer (bucketing), waited for"""
    flat = randn(dist, 2, 4)
    works = [dist.all_reduce(flat[0], async_op=True), dist.all_reduce(flat[1], op=dist.ReduceOp.MAX, async_op=True)]
    for w in works:
        w.wait()
    return flat


@case(4)
def broadcast_into_a_row(dist):
    """broadcast into a row of a matrix (a contiguous view)"""
    m = ramp(dist, 3, 4)
    dist.broadcast(m[1], src=2)
    return m


def fixed_send_and_receive_one_buffer(dist):
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((50_000,), float(r), dtype=torch.float64)
    y = torch.empty_like(x)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (r + 1) % n), dist.P2POp(dist.irecv, y, (r - 1) % n)]):
        w.wait()
    return y[:2], y[-2:]


@case(4, sim=InFlightError, gloo={WRONG, RIGHT}, fixed=fixed_send_and_receive_one_buffer)
def batch_send_and_receive_one_buffer(dist):
    """a ring shift in place: batch_isend_irecv sends x and receives into x at once (gloo: a race it may lose)"""
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((50_000,), float(r), dtype=torch.float64)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (r + 1) % n), dist.P2POp(dist.irecv, x, (r - 1) % n)]):
        w.wait()
    return x[:2], x[-2:]


@case(4, sim=InFlightError, gloo={WRONG, RIGHT}, fixed=fixed_send_and_receive_one_buffer)
def isend_then_irecv_into_the_same_buffer(dist):
    """isend(x) then irecv(x) before waiting: the receive may overwrite x while it is being sent"""
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((50_000,), float(r), dtype=torch.float64)
    a, b = dist.isend(x, (r + 1) % n), dist.irecv(x, (r - 1) % n)
    a.wait()
    b.wait()
    return x[:2], x[-2:]
