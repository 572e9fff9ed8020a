"""Naive p12: no expert parallelism. Every rank all-gathers the weights of all 8 experts (their gradients go back
to each expert's rank by a reduce-scatter in backward) and runs its own tokens through their experts locally, with
the capacity applied as the puzzle says. The values are right, but every rank holds all 8 experts (N times its
share), moves weights instead of tokens, and computes its own tokens rather than those routed to its experts."""

import math

import torch
import torch.nn.functional as F

EXPECTED_FAILURES = {"peak memory", "communication", "expert compute"}
DIAGNOSIS = "moves the tokens to the experts, not the experts to the tokens"


class GatherExperts(torch.autograd.Function):
    """Forward: every rank's flat expert weights, gathered. Backward: the gradients summed onto their owners."""

    @staticmethod
    def forward(ctx, flat, dist):
        ctx.dist = dist
        full = flat.new_empty(flat.numel() * dist.get_world_size())
        dist.all_gather_into_tensor(full, flat.contiguous())
        return full

    @staticmethod
    def backward(ctx, grad):
        mine = grad.new_empty(grad.numel() // ctx.dist.get_world_size())
        ctx.dist.reduce_scatter_tensor(mine, grad.contiguous())
        return mine, None


class AllToAll(torch.autograd.Function):  # unused by this answer
    @staticmethod
    def forward(ctx, x, dist, output_split_sizes, input_split_sizes):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


def moe_forward(dist, x, router, experts, capacity_factor):
    world, local = dist.get_world_size(), len(experts)
    n, n_experts = x.shape[0], world * local
    capacity = math.ceil(capacity_factor * n / n_experts)
    flat = torch.cat([w.reshape(-1) for pair in experts for w in pair])
    full = GatherExperts.apply(flat, dist).view(n_experts, -1)
    d, h = experts[0][0].shape
    gate, choice = torch.softmax(x @ router, dim=-1).max(dim=-1)
    onehot = F.one_hot(choice, n_experts)
    position = (onehot.cumsum(0) * onehot).sum(1) - 1
    contribution = torch.zeros_like(x)
    for e in range(n_experts):
        rows = torch.nonzero((choice == e) & (position < capacity)).squeeze(1)
        w1, w2 = full[e, :d * h].view(d, h), full[e, d * h:].view(h, d)
        out = F.gelu(x[rows] @ w1) @ w2
        contribution = contribution.index_copy(0, rows, gate[rows].unsqueeze(1) * out)
    return x + contribution
