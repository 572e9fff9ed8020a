"""p12 mistake (GShard's and Switch Transformer's fixed-size dispatch): every rank sends each expert a buffer of
exactly C rows, its kept tokens and zeros for the rest, so no counts are needed and every split is the same size.
The values are right (the padding's results are thrown away), but the padding crosses the links and runs through
the experts: the puzzle asks for the tokens only."""

import math

import torch
import torch.nn.functional as F

MISTAKE = "tokens dispatched in buffers padded to the capacity"
EXPECTED_FAILURES = {"expert compute", "communication"}
DIAGNOSIS = "padded to the capacity"


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist, output_split_sizes, input_split_sizes):
        ctx.dist, ctx.splits = dist, (list(output_split_sizes), list(input_split_sizes))
        out = x.new_empty((sum(output_split_sizes), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), list(output_split_sizes), list(input_split_sizes))
        return out

    @staticmethod
    def backward(ctx, grad):
        received, sent = ctx.splits
        back = grad.new_empty((sum(sent), *grad.shape[1:]))
        ctx.dist.all_to_all_single(back, grad.contiguous(), sent, received)
        return back, None, None, None


def moe_forward(dist, x, router, experts, capacity_factor):
    world, local = dist.get_world_size(), len(experts)
    n, n_experts = x.shape[0], world * local
    capacity = math.ceil(capacity_factor * n / n_experts)
    gate, choice = torch.softmax(x @ router, dim=-1).max(dim=-1)
    onehot = F.one_hot(choice, n_experts)
    position = (onehot.cumsum(0) * onehot).sum(1) - 1
    kept = torch.nonzero(position < capacity).squeeze(1)
    slot = choice[kept] * capacity + position[kept]  # the row of the [E·C, d] buffer
    buffer = torch.zeros(n_experts * capacity, x.shape[1], dtype=x.dtype).index_copy(0, slot, x[kept])
    splits = [local * capacity] * world
    tokens = AllToAll.apply(buffer, dist, splits, splits)  # [world, local, C, d]: padding included
    per_source = tokens.view(world, local, capacity, -1)
    outputs = torch.stack([(F.gelu(per_source[:, j].reshape(-1, x.shape[1]) @ w1) @ w2).view(world, capacity, -1)
                           for j, (w1, w2) in enumerate(experts)], dim=1)  # [world, local, C, d]
    returned = AllToAll.apply(outputs.reshape(-1, x.shape[1]), dist, splits, splits)
    return x + torch.zeros_like(x).index_copy(0, kept, gate[kept].unsqueeze(1) * returned[slot])
