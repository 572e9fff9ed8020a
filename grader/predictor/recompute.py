"""Activation recomputation (Megatron-LM's CheckpointFunction): run a piece of the forward without keeping what
it computes for backward, keep its inputs only, and run it again inside backward, just before its gradients
are needed.

    selective   the attention's core (q k^T, softmax, dropout, @ v): its [b·a/t, s, s] matrices are most of a
                layer's activations and few of its FLOPs (Korthikanti et al. 2022)
    full        each whole layer: it keeps its input [s, b, h] and runs its forward twice

The recomputed forward is labelled "recompute" on the clock. On real tensors the random-number state is put back
as it was, so that dropout draws the same mask twice; meta tensors draw nothing.
"""

from __future__ import annotations

import torch


class Recompute(torch.autograd.Function):
    """Recompute.apply(fn, extra, *tensors) = fn(*tensors, *extra), keeping only `tensors` for backward."""

    @staticmethod
    def forward(ctx, fn, extra, *tensors):
        ctx.fn, ctx.extra = fn, extra
        ctx.rng = None if any(t.is_meta for t in tensors) else torch.get_rng_state()
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            return fn(*tensors, *extra)

    @staticmethod
    def backward(ctx, *grads):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        outer = None
        if ctx.rng is not None:
            outer = torch.get_rng_state()
            torch.set_rng_state(ctx.rng)
        with torch.enable_grad(), torch.profiler.record_function("recompute"):
            outputs = ctx.fn(*inputs, *ctx.extra)
        if outer is not None:
            torch.set_rng_state(outer)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        torch.autograd.backward(outputs, grads)
        return (None, None, *(t.grad for t in inputs))
