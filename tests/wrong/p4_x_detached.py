"""p4 mistake: tp_forward starts from x.detach() ("the input is data"), so the graph never reaches x and x.grad
stays None; the weights' gradients are right."""

import torch
import torch.nn.functional as F

MISTAKE = "the input x is detached, so no gradient reaches it"
EXPECTED_FAILURES = {"input gradient", "compute"}
DIAGNOSIS = "does not reach x"


class CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.dist.all_reduce(grad)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, dist):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_forward(dist, x, shards):
    x = x.detach()
    for w1, w2 in shards:
        a = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)
        x = x + ReduceFromTensorParallel.apply(a @ w2, dist)
    return x
