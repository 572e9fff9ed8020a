"""p12, another style: the routing by a stable sort of the tokens by expert (each expert's first C in token order
are kept, by their place in the sorted order), the gate gathered from the probabilities, each local expert run on
its rows picked with nonzero and written back with index_copy, and the combine an index_add into x."""

import math

import torch
import torch.nn.functional as F


class AllToAll(torch.autograd.Function):
    """Rows out to every rank by split sizes; backward sends the gradients back with the splits swapped."""

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
    probs = torch.softmax(x @ router, dim=-1)
    choice = probs.argmax(dim=-1)
    order = torch.argsort(choice, stable=True)  # the tokens grouped by expert, in token order within each
    counts = torch.bincount(choice, minlength=n_experts)
    first = torch.cumsum(counts, 0) - counts  # where each expert's group starts in `order`
    rank_in_group = torch.arange(n) - first[choice[order]]
    kept = order[rank_in_group < capacity]  # already sorted by expert: rank d's block is experts 2d, 2d+1

    sent_counts = torch.bincount(choice[kept], minlength=n_experts)
    received_counts = torch.empty_like(sent_counts)
    dist.all_to_all_single(received_counts, sent_counts)
    send_splits = sent_counts.view(world, local).sum(1).tolist()
    recv_splits = received_counts.view(world, local).sum(1).tolist()

    tokens = AllToAll.apply(x[kept], dist, recv_splits, send_splits)
    whose = torch.arange(local).repeat(world).repeat_interleave(received_counts)
    results = torch.empty_like(tokens)
    for j, (w1, w2) in enumerate(experts):
        rows = torch.nonzero(whose == j).squeeze(1)
        if len(rows):
            results = results.index_copy(0, rows, F.gelu(tokens[rows] @ w1) @ w2)

    returned = AllToAll.apply(results, dist, send_splits, recv_splits)
    gate = probs[kept].gather(1, choice[kept].unsqueeze(1))  # the chosen expert's probability, for the kept tokens
    return x.index_add(0, kept, gate * returned)
