"""`dist`: the torch.distributed API as one rank sees it.

Each method checks its arguments, describes the call (a `_Call` that names its function in collectives.py, or
a send or recv) and hands it to the world (matching.py), which matches it with the other ranks' calls.

The checks refuse what torch.distributed (gloo) refuses, and what gloo would silently get wrong: a reduce op the
dtype cannot take, a non-contiguous tensor where gloo works on raw memory (all_reduce, broadcast, point to point).
As in torch.distributed, a rank outside a group (`GroupMember.NON_GROUP_MEMBER`) skips the call.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

from . import watchdog
from .collectives import (_all_gather, _all_gather_into_tensor, _all_reduce, _all_to_all, _all_to_all_single,
                          _broadcast, _Call, _nothing, _reduce_scatter_tensor)
from .handles import _overlaps
from .types import (NON_GROUP_MEMBER, AutogradWriteError, NonContiguousError, OverlapError, P2POp, ProcessGroup,
                    Registry, ReduceOp, Work, _desc, _reduce_op, _sig, check_reduce_dtype, handed)

if TYPE_CHECKING:
    from .world import World


# --------------------------------------------------------------------------------------------------------------
# `dist`: the torch.distributed API as one rank sees it.


class _GroupNamespace:
    def __init__(self, world_group: ProcessGroup):
        self.WORLD = world_group
        self.NON_GROUP_MEMBER = NON_GROUP_MEMBER


class _Dist:
    """The implementation of one rank's `dist` (SimDist, below, is what the rank holds). Same names, argument
    order, in-place semantics and return values as torch.distributed, so `fn(torch.distributed, ...)` in a real
    process group computes the same thing."""

    ReduceOp = ReduceOp
    P2POp = P2POp

    def __init__(self, world: World, rank: int):
        self._world, self._me = world, world.ranks[rank]
        self.group = _GroupNamespace(world.WORLD)
        self.GroupMember = self.group

    # ---- who am I

    def get_rank(self, group=None) -> int:
        group = self._world.WORLD if group is None else group
        return group.ranks.index(self._me.rank) if isinstance(group, ProcessGroup) and self._me.rank in group.ranks else -1

    def get_world_size(self, group=None) -> int:
        group = self._world.WORLD if group is None else group
        return len(group.ranks) if isinstance(group, ProcessGroup) and self._me.rank in group.ranks else -1

    def get_global_rank(self, group, group_rank: int) -> int:
        return group.ranks[group_rank]

    def get_group_rank(self, group, global_rank: int) -> int:
        return group.ranks.index(global_rank)

    def get_process_group_ranks(self, group) -> list[int]:
        return list(group.ranks)

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def get_backend(self, group=None) -> str:
        return "sim"

    def new_group(self, ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
                  group_desc=None):
        """Every rank must call it, with the same ranks, in the same order (as in torch.distributed).
        Members get the group; the other ranks get GroupMember.NON_GROUP_MEMBER."""
        world = self._world
        members = tuple(sorted(set(range(world.size) if ranks is None else ranks)))
        if not members or members[0] < 0 or members[-1] >= world.size:
            raise ValueError(f"new_group({ranks!r}): ranks must be within 0..{world.size - 1}")

        def make_group(calls):
            group = ProcessGroup(world, len(world.groups), members)
            group.timeout, group.desc = watchdog.ticks_of(timeout), group_desc  # Part IV: its own timeout
            world.groups.append(group)
            for c in calls:
                c.group_made = group

        call = _Call("new_group", make_group, {"ranks": list(members)})
        world.collective(self._me, call, world.GROUP_MAKER, async_op=False)
        return call.group_made if self._me.rank in members else NON_GROUP_MEMBER

    # ---- point to point

    def _peer(self, peer, group, group_peer):
        if group_peer is not None:
            return (group or self._world.WORLD).ranks[group_peer]
        return peer

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None) -> Work | None:
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("isend")
        self._check_contiguous(tensor, "isend")
        work = self._world.post_p2p(self._me, "send", tensor, self._peer(dst, group, group_dst), group, tag)
        self._world._mark_inflight(self._me, work, [tensor], [], "isend")
        self._world.yield_baton(self._me)
        return work

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None) -> Work | None:
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("irecv")
        self._check_contiguous(tensor, "irecv")
        work = self._world.post_p2p(self._me, "recv", tensor, self._peer(src, group, group_src), group, tag)
        self._world._mark_inflight(self._me, work, [], [tensor], "irecv")
        self._world.yield_baton(self._me)
        return work

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
        """Blocks until the matching recv is posted and the data has arrived (a rendezvous)."""
        if group is NON_GROUP_MEMBER:  # torch's send looks the peer up in the group before it would skip the call
            raise ValueError(f"rank {self._me.rank} called send at {self._world.site()} with "
                             f"GroupMember.NON_GROUP_MEMBER: torch.distributed raises \"Invalid process group "
                             f"specified\" here (new_group returned that because rank {self._me.rank} is not in "
                             f"the group). Call send only on ranks of the group.")
        self._check_contiguous(tensor, "send")
        work = self._world.post_p2p(self._me, "send", tensor, self._peer(dst, group, group_dst), group, tag)
        self._world.wait(self._me, work)

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None) -> int:
        """Blocks until a matching send arrives; returns the sender's rank (src=None receives from anyone)."""
        if group is NON_GROUP_MEMBER:
            self._not_in_group("recv")
            return -1
        self._check_contiguous(tensor, "recv")
        work = self._world.post_p2p(self._me, "recv", tensor, self._peer(src, group, group_src), group, tag)
        self._world.wait(self._me, work)
        return work._source

    def batch_isend_irecv(self, p2p_op_list) -> list[Work]:
        """Post every send and recv of the list, then return their handles (no ordering deadlock among them)."""
        if not p2p_op_list:  # torch.distributed reads the first op's group first: IndexError
            raise IndexError(f"rank {self._me.rank} called batch_isend_irecv with an empty list at "
                             f"{self._world.site()}: torch.distributed raises IndexError here. Call it only when "
                             f"there is something to send or receive.")
        works = []
        for p in p2p_op_list:
            kind = getattr(p.op, "__name__", "")
            if kind not in ("isend", "irecv"):
                raise ValueError(f"P2POp.op must be dist.isend or dist.irecv, got {p.op!r}")
            self._check_contiguous(p.tensor, kind)
            peer = self._peer(p.peer, p.group, p.group_peer)
            work = self._world.post_p2p(self._me, kind[1:], p.tensor, peer, p.group, p.tag)
            reads, writes = ([p.tensor], []) if kind == "isend" else ([], [p.tensor])
            self._world._mark_inflight(self._me, work, reads, writes, kind)
            works.append(work)
        self._world.yield_baton(self._me)
        return works

    # ---- what gloo refuses, or would get wrong

    def _not_in_group(self, what: str):
        """torch.distributed's answer to a call on a group the rank is not in: a warning, and nothing happens."""
        self._world.warnings.append(f"rank {self._me.rank} called {what} on GroupMember.NON_GROUP_MEMBER at "
                                    f"{self._world.site()}: skipped, as torch.distributed skips it")
        return None

    def _check_contiguous(self, tensor, what: str) -> None:
        """gloo hands all_reduce, broadcast and point-to-point ops the tensor's raw memory: a column or a strided
        slice would be read and written as if its elements were packed (wrong elements, silently), and send/recv
        and the all-to-alls refuse it. The gathers and reduce_scatter_tensor gloo copies element by element, but
        NCCL refuses a strided tensor in every collective, so an answer that passes here must not fail on GPUs:
        every op takes contiguous tensors only, and the error says how to get one."""
        if not isinstance(tensor, torch.Tensor) or tensor.is_contiguous():
            return
        if what in ("send", "isend"):
            gloo, how = "refuse it", f"send a contiguous copy instead: dist.{what}(t.contiguous(), ...)"
        elif what in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
            gloo, how = ("copy it element by element, but NCCL (torch's GPU backend) refuses it: \"Tensors must be "
                         "contiguous\""), (f"pass contiguous tensors: gather into a contiguous buffer and copy it "
                                            f"into place, and hand dist.{what} `t.contiguous()` as input (a copy)")
        elif what.startswith("all_to_all"):
            gloo, how = "refuse it (\"Tensors must be contiguous\")", (
                "send a contiguous copy (`t.contiguous()`), and receive into a contiguous buffer, then copy it into "
                "place")
        elif what in ("recv", "irecv"):
            gloo, how = "refuse it", (f"receive into a contiguous buffer, then copy it into place: "
                                      f"buf = torch.empty(t.shape, dtype=t.dtype); dist.{what}(buf, ...); t.copy_(buf)")
        else:
            gloo = "read and write the wrong elements, silently"
            how = (f"{what} a contiguous buffer and copy the result back: buf = t.contiguous(); "
                   f"dist.{what}(buf, ...); t.copy_(buf) (`.contiguous()` is a copy: handing it to dist.{what} "
                   f"alone would leave t unchanged)")
        raise NonContiguousError(
            f"rank {self._me.rank} passed a non-contiguous {_desc(tensor)} tensor (strides {tuple(tensor.stride())}: "
            f"a column, a strided slice or a transpose) to {what} at {self._world.site()}. gloo runs {what} on "
            f"the tensor's raw memory, so it would {gloo}. To fix it, {how}.")

    def _check_autograd(self, what: str, written, read=()) -> None:
        """gloo runs the gathers and reduce_scatter_tensor by writing into views of its output (and, for
        all_gather_into_tensor, reading views of its input) with autograd on: if one of those tensors requires
        grad and grad mode is on, autograd raises. all_reduce, broadcast and recv write the raw memory and do not."""
        if not torch.is_grad_enabled():
            return
        for t, role in [*((t, "output") for t in written), *((t, "input") for t in read)]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise AutogradWriteError(
                    f"rank {self._me.rank} passed a {_desc(t)} {role} that requires grad to {what} at "
                    f"{self._world.site()} while autograd records: gloo copies through views of it in place, which "
                    f"autograd refuses (a RuntimeError on real processes). Use a buffer that does not require "
                    f"grad, then make a leaf of the result: `full = torch.empty(...); dist.{what}(full, ...); "
                    f"full.requires_grad_()` (or run the call under torch.no_grad()).")

    # ---- collectives

    def _size(self, group) -> int:
        return len((group or self._world.WORLD).ranks) if isinstance(group or self._world.WORLD, ProcessGroup) else 0

    def all_reduce(self, tensor, op=ReduceOp.SUM, group=None, async_op=False):
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("all_reduce")
        op = _reduce_op(op)
        check_reduce_dtype(op, tensor, "all_reduce")
        self._check_contiguous(tensor, "all_reduce")
        call = _Call("all_reduce", _all_reduce, {"tensor": _sig(tensor), "op": op},
                     reads=[tensor], writes=[tensor], nbytes=_nbytes(tensor), tensor=tensor, op=op)
        return self._world.collective(self._me, call, group, async_op)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("all_gather")
        n = self._size(group)
        if len(tensor_list) != n or any(t.shape != tensor.shape or t.dtype != tensor.dtype for t in tensor_list):
            raise ValueError(f"all_gather on rank {self._me.rank}: tensor_list must hold {n} tensors shaped like "
                             f"the input {_desc(tensor)}, got {[_desc(t) for t in tensor_list]}")
        for t in (*tensor_list, tensor):
            self._check_contiguous(t, "all_gather")
        self._check_autograd("all_gather", tensor_list)
        call = _Call("all_gather", _all_gather, {"tensor": _sig(tensor)}, reads=[tensor], writes=list(tensor_list),
                     nbytes=n * _nbytes(tensor), tensor=tensor, tensor_list=tensor_list)
        return self._world.collective(self._me, call, group, async_op)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("all_gather_into_tensor")
        n = self._size(group)
        if output_tensor.numel() != n * input_tensor.numel() or output_tensor.dtype != input_tensor.dtype:
            raise ValueError(f"all_gather_into_tensor on rank {self._me.rank}: the output must hold {n} x the input "
                             f"{_desc(input_tensor)} of the same dtype, got {_desc(output_tensor)}")
        for t in (output_tensor, input_tensor):
            self._check_contiguous(t, "all_gather_into_tensor")
        self._check_autograd("all_gather_into_tensor", [output_tensor], [input_tensor])
        call = _Call("all_gather_into_tensor", _all_gather_into_tensor,
                     {"input": _sig(input_tensor), "output": _sig(output_tensor)},
                     reads=[input_tensor], writes=[output_tensor], nbytes=_nbytes(output_tensor),
                     input=input_tensor, output=output_tensor)
        return self._world.collective(self._me, call, group, async_op)

    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, group=None, async_op=False):
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("reduce_scatter_tensor")
        n, op = self._size(group), _reduce_op(op)
        check_reduce_dtype(op, input, "reduce_scatter_tensor")
        if input.numel() != n * output.numel() or output.dtype != input.dtype:
            raise ValueError(f"reduce_scatter_tensor on rank {self._me.rank}: the input must hold {n} x the output "
                             f"{_desc(output)} of the same dtype, got {_desc(input)}")
        for t in (output, input):
            self._check_contiguous(t, "reduce_scatter_tensor")
        self._check_autograd("reduce_scatter_tensor", [output])
        call = _Call("reduce_scatter_tensor", _reduce_scatter_tensor,
                     {"input": _sig(input), "output": _sig(output), "op": op},
                     reads=[input], writes=[output], nbytes=_nbytes(input), input=input, output=output, op=op)
        return self._world.collective(self._me, call, group, async_op)

    def broadcast(self, tensor, src=None, group=None, async_op=False, group_src=None):
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("broadcast")
        src = self._peer(src, group, group_src)
        g = group or self._world.WORLD
        if src is None or (isinstance(g, ProcessGroup) and src not in g.ranks):
            raise ValueError(f"broadcast on rank {self._me.rank}: src={src!r} must be a (global) rank of {g}")
        self._check_contiguous(tensor, "broadcast")
        is_root = src == self._me.rank
        call = _Call("broadcast", _broadcast, {"tensor": _sig(tensor), "src": src},
                     reads=[tensor] if is_root else [], writes=[] if is_root else [tensor],
                     nbytes=_nbytes(tensor), tensor=tensor, is_root=is_root)
        return self._world.collective(self._me, call, group, async_op)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        """Rank j's `output` gets, from each rank i, the rows of i's `input` meant for j (collectives.py)."""
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("all_to_all_single")
        g, what = group or self._world.WORLD, "all_to_all_single"
        n, me = self._size(group), g.ranks.index(self._me.rank) if self._me.rank in g.ranks else 0
        for t in (output, input):
            self._check_contiguous(t, what)
        if output.dtype != input.dtype or output.shape[1:] != input.shape[1:]:
            raise ValueError(f"{what} on rank {self._me.rank}: the output {_desc(output)} must hold rows shaped "
                             f"and typed like the input's {_desc(input)}")
        if _overlaps(output, input):
            raise OverlapError(f"rank {self._me.rank} passed an output that overlaps its input to {what} at "
                               f"{self._world.site()}: gloo overwrites the input while it still sends it (wrong "
                               f"values). Receive into a buffer of its own: out = torch.empty_like(x).")
        ins = self._splits(input, input_split_sizes, n, "input", what)
        outs = self._splits(output, output_split_sizes, n, "output", what)
        row = input[0].numel() * input.element_size() if input.dim() else input.element_size()
        call = _Call(what, _all_to_all_single, {"dtype": str(input.dtype).replace("torch.", ""),
                                                "rows": list(input.shape[1:])},
                     reads=[input], writes=[output], nbytes=_nbytes(input), input=input, output=output,
                     in_splits=ins, out_splits=outs, sent=(sum(ins) - ins[me]) * row,
                     received=(sum(outs) - outs[me]) * row, agree=_splits_agree)
        return self._world.collective(self._me, call, group, async_op)

    def all_to_all(self, output_tensor_list, input_tensor_list, group=None, async_op=False):
        """Rank j's output_tensor_list[i] gets rank i's input_tensor_list[j] (all of one shape, as gloo wants)."""
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("all_to_all")
        g = group or self._world.WORLD
        n, me = self._size(group), g.ranks.index(self._me.rank) if self._me.rank in g.ranks else 0
        if len(output_tensor_list) != n or len(input_tensor_list) != n:
            raise ValueError(f"all_to_all on rank {self._me.rank}: both lists must hold {n} tensors (one per rank), "
                             f"got {len(output_tensor_list)} outputs and {len(input_tensor_list)} inputs")
        for t in (*output_tensor_list, *input_tensor_list):
            self._check_contiguous(t, "all_to_all")
        shapes = {(tuple(t.shape), t.dtype) for t in (*output_tensor_list, *input_tensor_list)}
        if len(shapes) > 1:  # gloo: "ProcessGroupGloo::alltoall: invalid tensor size at index 1"
            raise ValueError(f"all_to_all on rank {self._me.rank} at {self._world.site()}: every tensor of both "
                             f"lists must have one shape and dtype (gloo refuses others), got "
                             f"{sorted({_desc(t) for t in (*output_tensor_list, *input_tensor_list)})}. For an "
                             f"uneven exchange use all_to_all_single with output_split_sizes and input_split_sizes.")
        sizes = [_nbytes(t) for t in input_tensor_list]
        call = _Call("all_to_all", _all_to_all, {"dtype": str(input_tensor_list[0].dtype).replace("torch.", "")},
                     reads=list(input_tensor_list), writes=list(output_tensor_list), nbytes=sum(sizes),
                     input_list=list(input_tensor_list), output_list=list(output_tensor_list),
                     sent=sum(sizes) - sizes[me],
                     received=sum(_nbytes(t) for t in output_tensor_list) - _nbytes(output_tensor_list[me]),
                     agree=_lists_agree)
        return self._world.collective(self._me, call, group, async_op)

    def _splits(self, t, sizes, n: int, which: str, what: str) -> list[int]:
        """The rows of `t` for each rank: `sizes` as given (n whole numbers that add up to t's rows), or n equal
        parts."""
        rows = t.shape[0] if t.dim() else 1
        if sizes is None:
            if rows % n:
                raise ValueError(f"{what} on rank {self._me.rank}: the {which} has {rows} rows, which do not split "
                                 f"into {n} equal parts; give {which}_split_sizes")
            return [rows // n] * n
        sizes = [int(s) for s in sizes]
        if len(sizes) != n or min(sizes) < 0 or sum(sizes) != rows:
            raise ValueError(f"{what} on rank {self._me.rank}: {which}_split_sizes={sizes} must be {n} sizes, "
                             f"one per rank, adding up to the {which}'s {rows} rows")
        return sizes

    def barrier(self, group=None, async_op=False, device_ids=None):
        if group is NON_GROUP_MEMBER:
            return self._not_in_group("barrier")
        return self._world.collective(self._me, _Call("barrier", _nothing, {}), group, async_op)


# --------------------------------------------------------------------------------------------------------------
# What a rank holds: the API, and no lever. The implementation above keeps the world and the rank's state (its
# clock, its ledger's owner, its running totals) in attributes; `dist` reaches it only through a registry of this
# module's, so that no attribute of the object a rank is handed (`vars(dist)`, `dist._world`, `dist._me`) leads to
# the simulator's state. (Code that reads this module's own globals to get there is a learner who reads the grader
# to defeat it: docs/grading.md, "Threat model".)

_IMPLEMENTATIONS = Registry()  # SimDist -> its _Dist


class SimDist:
    """What `fn` receives as `dist`: torch.distributed's API as one rank sees it (each method's own docstring says
    what it does here). A view without levers: none of its attributes leads to the simulator's world or to the
    rank's state, so a rank can call the API and nothing else."""

    __slots__ = ("group", "GroupMember", "__weakref__")
    ReduceOp = ReduceOp
    P2POp = P2POp

    def __init__(self, world: World, rank: int):
        implementation = _Dist(world, rank)
        _IMPLEMENTATIONS.hold(self, implementation)
        self.group = self.GroupMember = implementation.group

    def __getattr__(self, name: str):  # (only for a name that is not found: the API's never reach here)
        raise AttributeError(f"dist has no attribute {name!r}: it offers torch.distributed's API (dist.get_rank(), "
                             f"dist.all_reduce(t), ...) and holds none of the simulator's state" + (
                                 " (a private name: no puzzle needs the simulator's insides)"
                                 if name.startswith("_") else ""))

    def __repr__(self) -> str:
        return f"<dist of rank {_IMPLEMENTATIONS.of[id(self)]._me.rank} (simulated)>"


def _forward(name: str, implementation_method):
    def method(self, *args, **kwargs):
        return handed(implementation_method(_IMPLEMENTATIONS.of[id(self)], *args, **kwargs))

    method.__name__, method.__qualname__ = name, f"SimDist.{name}"
    method.__doc__ = implementation_method.__doc__
    method.__signature__ = inspect.signature(implementation_method)
    return method


for _name, _method in list(vars(_Dist).items()):
    if not _name.startswith("_") and inspect.isfunction(_method):
        setattr(SimDist, _name, _forward(_name, _method))
del _name, _method


def _splits_agree(calls) -> str | None:
    """What rank i sends to rank j must be what j expects from i (None when every pair agrees)."""
    for i, src in enumerate(calls):
        for j, dst in enumerate(calls):
            if src.in_splits[j] != dst.out_splits[i]:
                return (f"rank {src.rank} sends {src.in_splits[j]} rows to rank {dst.rank} (input_split_sizes "
                        f"{src.in_splits} at {src.site}), but rank {dst.rank} expects {dst.out_splits[i]} rows from "
                        f"rank {src.rank} (output_split_sizes {dst.out_splits} at {dst.site}). Send the counts first "
                        f"(an all_to_all_single of one number per rank), then size each side from them.")
    return None


def _lists_agree(calls) -> str | None:
    for i, src in enumerate(calls):
        for j, dst in enumerate(calls):
            a, b = src.input_list[j], dst.output_list[i]
            if a.shape != b.shape or a.dtype != b.dtype:
                return (f"rank {src.rank} sends a {_desc(a)} tensor to rank {dst.rank} (at {src.site}), but rank "
                        f"{dst.rank} receives it into a {_desc(b)} tensor (at {dst.site})")
    return None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
