"""all_to_all_single and all_to_all: the exchange of a mixture of experts, even and uneven, and what gloo refuses
or gets wrong (a strided tensor; an output that is the input; split sizes the ranks do not agree on)."""

import torch

from puzzles.sim import CollectiveMismatchError, NonContiguousError, OverlapError

from .case import DIED, HUNG, RAISED, RIGHT, WRONG, case
from .data import ramp, randint


def _uneven_splits(dist):
    """Rank i sends i + j + 1 rows to rank j, so rank j receives i + j + 1 rows from each rank i."""
    n, me = dist.get_world_size(), dist.get_rank()
    sends = [me + j + 1 for j in range(n)]
    receives = [i + me + 1 for i in range(n)]
    return sends, receives


@case(4)
def all_to_all_single_even(dist):
    """every rank sends one equal chunk of rows to each rank"""
    x = ramp(dist, 8, 3)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


@case(4)
def all_to_all_single_uneven(dist):
    """rows of other sizes to each rank, given by input_split_sizes and output_split_sizes"""
    sends, receives = _uneven_splits(dist)
    x = ramp(dist, sum(sends), 2)
    out = torch.empty(sum(receives), 2, dtype=x.dtype)
    dist.all_to_all_single(out, x, output_split_sizes=receives, input_split_sizes=sends)
    return out


@case(4)
def all_to_all_single_counts_then_rows(dist):
    """the mixture of experts' exchange: counts first (one number per rank), then the rows, sized by the counts"""
    n = dist.get_world_size()
    dest = randint(dist, 10, low=0, high=n)  # where each of this rank's 10 tokens goes
    order = torch.argsort(dest, stable=True)
    sends = torch.bincount(dest, minlength=n)
    receives = torch.empty_like(sends)
    dist.all_to_all_single(receives, sends)
    tokens = ramp(dist, 10, 4)[order]
    out = torch.empty(int(receives.sum()), 4, dtype=tokens.dtype)
    dist.all_to_all_single(out, tokens, output_split_sizes=receives.tolist(), input_split_sizes=sends.tolist())
    return receives, out


@case(2)
def all_to_all_single_int64(dist):
    x = torch.arange(4, dtype=torch.int64) + 10 * dist.get_rank()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


@case(2)
def all_to_all_single_float16(dist):
    x = torch.arange(4, dtype=torch.float16) + 10 * dist.get_rank()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


@case(4)
def all_to_all_single_async(dist):
    x = ramp(dist, 8)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, async_op=True).wait()
    return out


@case(4)
def all_to_all_single_sub_group(dist):
    """on the even ranks and the odd ranks, separately"""
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    group = evens if dist.get_rank() % 2 == 0 else odds
    x = ramp(dist, 4)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


@case(4)
def all_to_all_lists(dist):
    """the list form: rank j's output[i] gets rank i's input[j]"""
    n = dist.get_world_size()
    ins = [ramp(dist, 3) + 10 * j for j in range(n)]
    outs = [torch.empty(3, dtype=torch.float64) for _ in range(n)]
    dist.all_to_all(outs, ins)
    return outs


@case(4, sim=ValueError, gloo={RAISED})
def all_to_all_lists_of_other_sizes(dist):
    """the list form with tensors of several sizes: gloo raises "ProcessGroupGloo::alltoall: invalid tensor size" """
    n, me = dist.get_world_size(), dist.get_rank()
    ins = [ramp(dist, me + j + 1) for j in range(n)]
    outs = [torch.empty(i + me + 1, dtype=torch.float64) for i in range(n)]
    dist.all_to_all(outs, ins)
    return outs


@case(2, sim=NonContiguousError, gloo={RAISED})
def all_to_all_single_strided_input(dist):
    """a column as the input: gloo raises "Tensors must be contiguous" """
    x = ramp(dist, 4, 2)[:, 0]
    out = torch.empty(4, dtype=torch.float64)
    dist.all_to_all_single(out, x)
    return out


def fixed_all_to_all_single_in_place(dist):
    x = ramp(dist, 4)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


@case(2, sim=OverlapError, gloo={WRONG, RIGHT}, fixed=fixed_all_to_all_single_in_place)
def all_to_all_single_in_place(dist):
    """the output is the input: gloo overwrites rows it still has to send (a race: measured wrong values, and once,
    on a busy machine, right ones)"""
    x = ramp(dist, 4)
    dist.all_to_all_single(x, x)
    return x


def fixed_all_to_all_single_sizes_disagree(dist):
    x = ramp(dist, 2)
    out = torch.empty(2, dtype=torch.float64)
    dist.all_to_all_single(out, x, output_split_sizes=[1, 1], input_split_sizes=[1, 1])
    return out


@case(2, sim=CollectiveMismatchError, gloo={RAISED, HUNG, DIED, WRONG}, fixed=fixed_all_to_all_single_sizes_disagree)
def all_to_all_single_sizes_disagree(dist):
    """rank 1 expects 2 rows from rank 0, which sends it 1 (gloo returns without a word)"""
    sends, receives = ([1, 1], [1, 1]) if dist.get_rank() == 0 else ([1, 1], [2, 1])
    x = ramp(dist, sum(sends))
    out = torch.empty(sum(receives), dtype=torch.float64)
    dist.all_to_all_single(out, x, output_split_sizes=receives, input_split_sizes=sends)
    return out
