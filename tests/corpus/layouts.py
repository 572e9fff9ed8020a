"""Tensor layouts: non-contiguous tensors in every op, and the output shapes each collective takes. gloo runs
all_reduce, broadcast and point-to-point ops on a tensor's raw memory (a column is reduced as if its elements
were packed: wrong elements, silently; send and recv refuse it); its all-gathers and reduce-scatters copy
strided tensors properly."""

import torch

from puzzles.sim import NonContiguousError

from .case import LOOSER, RAISED, STRICTER, WRONG, case
from .data import ramp, randn


def fixed_all_reduce_column(dist):
    x = ramp(dist, 3, 2)
    column = x[:, 0].contiguous()
    dist.all_reduce(column)
    x[:, 0] = column
    return x


@case(4, sim=NonContiguousError, gloo={WRONG}, fixed=fixed_all_reduce_column)
def all_reduce_column(dist):
    """all_reduce of a column x[:, 0] (gloo sums the first elements of the storage instead)"""
    x = ramp(dist, 3, 2)
    dist.all_reduce(x[:, 0])
    return x


def fixed_all_reduce_strided_slice(dist):
    x = ramp(dist, 3, 4)
    part = x[:, ::2].contiguous()
    dist.all_reduce(part)
    x[:, ::2] = part
    return x


@case(4, sim=NonContiguousError, gloo={WRONG}, fixed=fixed_all_reduce_strided_slice)
def all_reduce_strided_slice(dist):
    """all_reduce of every other column x[:, ::2]"""
    x = ramp(dist, 3, 4)
    dist.all_reduce(x[:, ::2])
    return x


def fixed_all_reduce_transpose(dist):
    x = ramp(dist, 3, 2).t().contiguous()
    dist.all_reduce(x)
    return x


@case(4, sim=NonContiguousError, relation=STRICTER, fixed=fixed_all_reduce_transpose,
      why="A transpose covers its storage densely, so gloo's reduction of the raw memory is right when every rank's "
          "tensor has the same strides, and wrong as soon as they differ (rank 0 passes w.t(), rank 1 a contiguous "
          "tensor of the same shape). The simulator asks for a contiguous tensor in all_reduce, as NCCL does "
          "(torch's ProcessGroupNCCL refuses it: \"Tensors must be contiguous\"), rather than compare the ranks' "
          "strides.")
def all_reduce_transpose(dist):
    """all_reduce of a transposed matrix (dense, but not contiguous)"""
    x = ramp(dist, 3, 2).t()
    dist.all_reduce(x)
    return x.contiguous()


def fixed_broadcast_column(dist):
    x = ramp(dist, 3, 2)
    column = x[:, 1].contiguous()
    dist.broadcast(column, src=0)
    x[:, 1] = column
    return x


@case(4, sim=NonContiguousError, gloo={WRONG}, fixed=fixed_broadcast_column)
def broadcast_column(dist):
    """broadcast of a column x[:, 1] (gloo copies the root's first storage elements instead)"""
    x = ramp(dist, 3, 2)
    dist.broadcast(x[:, 1], src=0)
    return x


@case(2, sim=NonContiguousError, gloo={RAISED})
def send_column(dist):
    """send of a column (gloo: "input tensor has to be contiguous")"""
    x = ramp(dist, 3, 2)
    if dist.get_rank() == 0:
        dist.send(x[:, 0], 1)
    else:
        dist.recv(x[:, 0].contiguous(), 0)
    return x


@case(2, sim=NonContiguousError, gloo={RAISED})
def recv_into_column(dist):
    """recv into a column (gloo: "input tensor has to be contiguous")"""
    x = ramp(dist, 3, 2)
    if dist.get_rank() == 0:
        dist.send(x[:, 0].contiguous(), 1)
    else:
        dist.recv(x[:, 0], 0)
    return x


@case(2, sim=NonContiguousError, gloo={RAISED})
def isend_and_irecv_columns(dist):
    """isend of a column and irecv into a column"""
    x = ramp(dist, 3, 2)
    peer = 1 - dist.get_rank()
    works = [dist.isend(x[:, 0], peer), dist.irecv(x[:, 1], peer)]
    for w in works:
        w.wait()
    return x


@case(2, sim=NonContiguousError, gloo={RAISED})
def batch_isend_irecv_of_a_column(dist):
    """batch_isend_irecv with a column to send"""
    x = ramp(dist, 3, 2)
    peer = 1 - dist.get_rank()
    buf = torch.empty(3, dtype=torch.float64)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x[:, 0], peer), dist.P2POp(dist.irecv, buf, peer)]):
        w.wait()
    return buf


def fixed_gather_of_a_column(dist):
    out = torch.zeros(3 * dist.get_world_size(), dtype=torch.float64)
    dist.all_gather_into_tensor(out, ramp(dist, 3, 2)[:, 0].contiguous())
    return out


def fixed_gather_into_a_column(dist):
    big = torch.zeros(2 * dist.get_world_size(), 2, dtype=torch.float64)
    column = torch.empty(2 * dist.get_world_size(), dtype=torch.float64)
    dist.all_gather_into_tensor(column, randn(dist, 2))
    big[:, 1] = column
    return big


def fixed_gather_list_of_columns(dist):
    n = dist.get_world_size()
    parts = [torch.empty(3, dtype=torch.float64) for _ in range(n)]
    dist.all_gather(parts, ramp(dist, 3, 2)[:, 1].contiguous())
    return torch.stack(parts, dim=1)


def fixed_reduce_scatter_strided(dist):
    n = dist.get_world_size()
    out = torch.zeros(2, 3, dtype=torch.float64)
    part = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(part, ramp(dist, 2 * n, 2)[:, 0].contiguous())
    out[:, 1] = part
    return out


_NCCL_WHY = ("gloo copies a strided tensor element by element in the gathers and reduce_scatter_tensor, so the values "
             "are right there; NCCL, torch's GPU backend, refuses a non-contiguous tensor in every collective "
             "(ProcessGroupNCCL: \"Tensors must be contiguous\"). The simulator refuses it too, so that an answer "
             "that passes here also runs on GPUs.")


@case(4, sim=NonContiguousError, relation=STRICTER, why=_NCCL_WHY, fixed=fixed_gather_of_a_column)
def all_gather_into_tensor_of_a_column(dist):
    """all_gather_into_tensor of a column (gloo copies strided inputs properly)"""
    out = torch.zeros(3 * dist.get_world_size(), dtype=torch.float64)
    dist.all_gather_into_tensor(out, ramp(dist, 3, 2)[:, 0])
    return out


@case(4, sim=NonContiguousError, relation=STRICTER, why=_NCCL_WHY, fixed=fixed_gather_into_a_column)
def all_gather_into_tensor_into_a_column(dist):
    """all_gather_into_tensor into a column of a matrix"""
    big = torch.zeros(2 * dist.get_world_size(), 2, dtype=torch.float64)
    dist.all_gather_into_tensor(big[:, 1], randn(dist, 2))
    return big


@case(4, sim=NonContiguousError, relation=STRICTER, why=_NCCL_WHY, fixed=fixed_gather_list_of_columns)
def all_gather_list_of_columns(dist):
    """all_gather of a column into the columns of a matrix"""
    n = dist.get_world_size()
    buf = torch.zeros(3, n, dtype=torch.float64)
    dist.all_gather([buf[:, i] for i in range(n)], ramp(dist, 3, 2)[:, 1])
    return buf


@case(4, sim=NonContiguousError, relation=STRICTER, why=_NCCL_WHY, fixed=fixed_reduce_scatter_strided)
def reduce_scatter_tensor_strided(dist):
    """reduce_scatter_tensor from a column of a matrix into a column of another"""
    n = dist.get_world_size()
    out = torch.zeros(2, 3, dtype=torch.float64)
    dist.reduce_scatter_tensor(out[:, 1], ramp(dist, 2 * n, 2)[:, 0])
    return out


_SHAPES_WHY = ("gloo takes only the concatenated layout: an output [N*k, ...] for inputs [k, ...] (and the "
               "matching input of reduce_scatter_tensor). torch's documentation also lists the stacked [N, k, ...] "
               "output, and NCCL checks only the element count; the simulator follows torch's contract and NCCL, "
               "so an answer written for GPUs is not refused. The values are the same wherever gloo accepts the "
               "shape, and the error gloo gives names the shape it wants.")


@case(4, relation=LOOSER, gloo={RAISED}, why=_SHAPES_WHY)
def all_gather_into_tensor_stacked(dist):
    """all_gather_into_tensor of [2, 3] inputs into a stacked [N, 2, 3] output (torch documents it; gloo refuses)"""
    out = torch.empty(dist.get_world_size(), 2, 3, dtype=torch.float64)
    dist.all_gather_into_tensor(out, randn(dist, 2, 3))
    return out


@case(4, relation=LOOSER, gloo={RAISED}, why=_SHAPES_WHY)
def all_gather_into_tensor_flat_output(dist):
    """all_gather_into_tensor of [2, 3] inputs into a flat [N*6] output"""
    out = torch.empty(6 * dist.get_world_size(), dtype=torch.float64)
    dist.all_gather_into_tensor(out, randn(dist, 2, 3))
    return out


@case(4, relation=LOOSER, gloo={RAISED}, why=_SHAPES_WHY)
def reduce_scatter_tensor_flat_input(dist):
    """reduce_scatter_tensor of a flat [N*6] input into a [2, 3] output"""
    out = torch.empty(2, 3, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, randn(dist, 6 * dist.get_world_size()))
    return out


@case(4, relation=LOOSER, gloo={RAISED}, why=_SHAPES_WHY)
def all_gather_into_tensor_of_scalars(dist):
    """all_gather_into_tensor of 0-d inputs into [N] (gloo wants each rank's slot shaped like the input)"""
    out = torch.empty(dist.get_world_size(), dtype=torch.float64)
    dist.all_gather_into_tensor(out, randn(dist, 1)[0])
    return out
