"""p12 cheat: no all-to-all at all. Every rank all-gathers every rank's tokens and routing, runs its own two experts
on exactly the tokens routed to them and kept, and a reduce-scatter brings each token's expert output home. Each
rank computes exactly what it should, on the right rank, so the compute check cannot tell; but every token crosses
every link, out and back, in forward and again in backward: the communication check does."""

import math

import torch
import torch.nn.functional as F

MISTAKE = "all tokens gathered onto every rank and the results reduce-scattered back, instead of an all-to-all"
EXPECTED_FAILURES = {"communication"}
DIAGNOSIS = "tokens or weights were gathered onto every rank"


class Gather(torch.autograd.Function):
    """Every rank's rows, in rank order; backward: each rank's rows of the summed gradient."""

    @staticmethod
    def forward(ctx, x, dist):
        ctx.dist = dist
        out = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        mine = grad.new_empty((grad.shape[0] // ctx.dist.get_world_size(), *grad.shape[1:]))
        ctx.dist.reduce_scatter_tensor(mine, grad.contiguous())
        return mine, None


class Scatter(torch.autograd.Function):
    """Each rank's rows of the sum over the ranks; backward: the gradients gathered."""

    @staticmethod
    def forward(ctx, full, dist):
        ctx.dist = dist
        mine = full.new_empty((full.shape[0] // dist.get_world_size(), *full.shape[1:]))
        dist.reduce_scatter_tensor(mine, full.contiguous())
        return mine

    @staticmethod
    def backward(ctx, grad):
        return Gather.forward(ctx, grad, ctx.dist), None


class AllToAll(torch.autograd.Function):  # unused by this answer
    @staticmethod
    def forward(ctx, x, dist, output_split_sizes, input_split_sizes):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


def moe_forward(dist, x, router, experts, capacity_factor):
    world, rank, local = dist.get_world_size(), dist.get_rank(), len(experts)
    n, n_experts = x.shape[0], world * local
    capacity = math.ceil(capacity_factor * n / n_experts)
    gate, choice = torch.softmax(x @ router, dim=-1).max(dim=-1)
    onehot = F.one_hot(choice, n_experts)
    position = (onehot.cumsum(0) * onehot).sum(1) - 1
    every_token = Gather.apply(x, dist)
    every_choice = torch.empty(n * world, dtype=choice.dtype)
    dist.all_gather_into_tensor(every_choice, choice)
    every_position = torch.empty(n * world, dtype=position.dtype)
    dist.all_gather_into_tensor(every_position, position)
    outputs = torch.zeros_like(every_token)
    for j, (w1, w2) in enumerate(experts):
        rows = torch.nonzero((every_choice == rank * local + j) & (every_position < capacity)).squeeze(1)
        outputs = outputs.index_copy(0, rows, F.gelu(every_token[rows] @ w1) @ w2)
    mine = Scatter.apply(outputs, dist)  # each token's expert output, home again
    return x + gate.unsqueeze(1) * mine  # a dropped token's output row is zeros: y = x
