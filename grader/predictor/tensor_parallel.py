"""Megatron-LM's tensor and sequence parallelism, as autograd Functions over a tensor-parallel group.

Activations are [s, b, h] (sequence first, as Megatron keeps them), so a sequence-parallel shard [s/t, b, h] is
a contiguous block of rows and the collectives cut and join dim 0 without a copy.

    ColumnParallelLinear   y_r = x @ W_r^T + b_r     W split by rows (its output features)
                           SP: x is this rank's [s/t, b, h]; all-gathered to [s, b, h] first, and gathered again
                           in backward (only the shard is kept: Megatron's memory saving), the input's gradient
                           reduce-scattered; no SP: the input's gradient all-reduced (f). With `overlap`, the
                           backward's collectives run asynchronously, the all-gather under the input gradient's
                           product and the all-reduce or reduce-scatter under the weight gradient's, as Megatron
                           issues them (config.py's tp_overlap); without, one after the other.
    RowParallelLinear      y = sum_r x_r @ W_r^T     W split by columns (its input features)
                           no SP: all-reduce the partial sums (g); SP: reduce-scatter them to [s/t, b, h]
    communicate=False      the product alone, when a learner's operators move the data around it (gpt.py)

The weight gradient's product writes into the weight's float32 gradient buffer (`main_grad`) as it accumulates
(Megatron's gradient-accumulation fusion: the GEMM's output is the float32 buffer), so no half-precision
gradient of a weight is ever made; into a half-precision buffer, the product and then an addition.

`TensorParallel` is the group as a rank sees it. When one simulated rank stands for its whole group (cluster.py,
Placement.stand_in), the simulated group holds that rank alone: a collective on it moves the rank's own piece
and is charged as the whole group's, the buffers are the sizes the real group's are, and the values are
meaningless (these runs use meta tensors, which have none).
"""

from __future__ import annotations

import torch

def accumulate_weight_grad(main_grad: torch.Tensor, grad_out: torch.Tensor, inputs: torch.Tensor) -> None:
    """main_grad (float32, [out, in]) += grad_out^T @ inputs, both [tokens, .] in half precision.

    Megatron's fused kernel is a half-precision GEMM whose output is the float32 buffer it accumulates into. The
    clock charges an op at the rate of its output's dtype, so the aten op that computes exactly this (addmm with
    out_dtype=float32) would be charged as a float32 product, 16 times slower than the tensor cores run it, and
    a half-precision product added into the buffer costs a pass over the buffer the fused kernel does not make.
    On meta tensors, which hold no values, the product is therefore written into the buffer's memory seen as
    half precision: what the kernel costs, no more. On real tensors, and into a half-precision buffer (config's
    grad_dtype "half": autograd's accumulation of Megatron-LM of 2021, which had no fused kernel): the product,
    then the addition."""
    if main_grad.is_meta and grad_out.dtype in (torch.float16, torch.bfloat16) and main_grad.dtype == torch.float32:
        as_half = main_grad.view(grad_out.dtype)[..., ::2]  # [out, in] over the float32 buffer's bytes
        torch.addmm(as_half, grad_out.t(), inputs, out=as_half)
    else:
        main_grad.add_(grad_out.t() @ inputs)


class TensorParallel:
    """A rank's tensor-parallel group: `size` ranks (the configuration's t), of which this one is `rank`.
    `group` is the simulated group: all t ranks, or this rank alone when it stands for the others."""

    def __init__(self, dist, group, size: int, rank: int, stand_in: bool, overlap: bool = False, cost=None):
        self.dist, self.group, self.size, self.rank, self.stand_in = dist, group, size, rank, stand_in
        self.overlap = overlap  # backward's collectives asynchronous, under the products (config's tp_overlap)
        self.cost = cost  # the clock's cost model (cluster.py), which charges the SMs a collective in flight takes

    def _in_flight(self, handle, kind: str, nbytes: int):
        if handle is None or self.cost is None or not hasattr(self.cost, "in_flight"):
            return handle
        return self.cost.in_flight(handle, kind, nbytes, self.group.ranks)

    def all_reduce(self, x: torch.Tensor, async_op: bool = False, op=None):
        if self.size == 1:
            return None
        kwargs = {} if op is None else {"op": op}
        handle = self.dist.all_reduce(x, group=self.group, async_op=async_op, **kwargs)
        return self._in_flight(handle, "all_reduce", _nbytes(x)) if async_op else handle

    def all_gather(self, shard: torch.Tensor, async_op: bool = False):
        """[n, ...] on each rank -> [t·n, ...], rank r's rows r·n to (r+1)·n - 1. Returns (full, handle)."""
        if self.size == 1:
            return shard, None
        full = torch.empty((self.size * shard.shape[0], *shard.shape[1:]), dtype=shard.dtype, device=shard.device)
        mine = full[: shard.shape[0]] if self.stand_in else full  # a stand-in moves its own piece
        handle = self.dist.all_gather_into_tensor(mine, shard.contiguous(), group=self.group, async_op=async_op)
        return full, (self._in_flight(handle, "all_gather_into_tensor", _nbytes(mine)) if async_op else handle)

    def reduce_scatter(self, full: torch.Tensor, async_op: bool = False):
        """[t·n, ...] partial sums on each rank -> this rank's [n, ...] of the sum. Returns (shard, handle)."""
        if self.size == 1:
            return full, None
        n = full.shape[0] // self.size
        shard = torch.empty((n, *full.shape[1:]), dtype=full.dtype, device=full.device)
        source = (full[:n] if self.stand_in else full).contiguous()
        handle = self.dist.reduce_scatter_tensor(shard, source, group=self.group, async_op=async_op)
        return shard, (self._in_flight(handle, "reduce_scatter_tensor", _nbytes(source)) if async_op else handle)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Alone:
    """A group of one: its collectives do nothing (the products of a layer whose operators are the caller's)."""

    size, rank, stand_in, overlap = 1, 0, False, False

    def all_reduce(self, x, async_op=False, op=None):
        return None

    def all_gather(self, shard, async_op=False):
        return shard, None

    def reduce_scatter(self, full, async_op=False):
        return full, None


_ALONE = _Alone()


def _wait(handle) -> None:
    if handle is not None:
        handle.wait()


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


class ColumnParallelLinear(torch.autograd.Function):
    """y_r = x @ W_r^T + b_r on [s, b, h] (SP: x is [s/t, b, h], gathered first). apply(x, weight, bias, tp,
    sequence_parallel, communicate=True): weight.main_grad and bias.main_grad receive the gradients (float32).
    communicate=False: the product alone (the caller's operators move the data: a learner's f, or gather)."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp: TensorParallel, sequence_parallel: bool, communicate: bool = True):
        if not communicate:
            tp, sequence_parallel = _ALONE, False
        total, handle = tp.all_gather(x) if sequence_parallel else (x, None)
        _wait(handle)
        s, b = total.shape[0], total.shape[1]
        rows = _rows(total)
        y = torch.mm(rows, weight.t()) if bias is None else torch.addmm(bias, rows, weight.t())
        ctx.save_for_backward(x, weight)  # under SP the shard only: the whole input is gathered again
        ctx.bias, ctx.tp, ctx.sp = bias, tp, sequence_parallel
        return y.view(s, b, -1)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        tp, sp = ctx.tp, ctx.sp
        total, gathering = tp.all_gather(x, async_op=tp.overlap) if sp else (x, None)
        grad_rows = _rows(grad)
        grad_input = torch.mm(grad_rows, weight).view(*grad.shape[:2], -1)  # [s, b, h]: partial sums over ranks
        _wait(gathering)
        if sp:
            grad_x, reducing = tp.reduce_scatter(grad_input, async_op=tp.overlap)
        else:
            grad_x, reducing = grad_input, tp.all_reduce(grad_input, async_op=tp.overlap)
        accumulate_weight_grad(weight.main_grad, grad_rows, _rows(total))  # under the collective
        if ctx.bias is not None:
            ctx.bias.main_grad.add_(grad_rows.sum(0))
        _wait(reducing)
        return grad_x, None, None, None, None, None


class RowParallelLinear(torch.autograd.Function):
    """The partial product x_r @ W_r^T on [s, b, h/t], summed over the group: all-reduced to [s, b, h] or, under
    SP, reduce-scattered to [s/t, b, h]. apply(x, weight, tp, sequence_parallel); no bias (Megatron adds it after
    the sum, in the bias-dropout-add)."""

    @staticmethod
    def forward(ctx, x, weight, tp: TensorParallel, sequence_parallel: bool, communicate: bool = True):
        if not communicate:
            tp, sequence_parallel = _ALONE, False
        partial = torch.mm(_rows(x), weight.t()).view(*x.shape[:2], -1)
        ctx.save_for_backward(x, weight)
        ctx.tp, ctx.sp = tp, sequence_parallel
        if sequence_parallel:
            out, handle = tp.reduce_scatter(partial)
            _wait(handle)
            return out
        tp.all_reduce(partial)
        return partial

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        total, handle = ctx.tp.all_gather(grad) if ctx.sp else (grad, None)
        _wait(handle)
        grad_rows = _rows(total)
        grad_x = torch.mm(grad_rows, weight).view(*x.shape)
        accumulate_weight_grad(weight.main_grad, grad_rows, _rows(x))
        return grad_x, None, None, None, None
