"""p12, another style: the received rows are not regrouped by expert; each source rank's chunk for each local
expert (the counts say which rows are whose) goes through its expert on its own, so an expert runs once per source
rank. The same FLOPs and bytes; autograd then adds one fresh weight gradient per chunk into each expert's .grad."""

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
    gate, choice = torch.softmax(x @ router, dim=-1).max(dim=-1)  # top-1: each token's p and expert
    onehot = F.one_hot(choice, n_experts)
    position = (onehot.cumsum(0) * onehot).sum(1) - 1  # the token's place among those routed to its expert
    kept = torch.nonzero(position < capacity).squeeze(1)  # the first C per expert, in token order
    kept = kept[torch.argsort(choice[kept], stable=True)]  # sorted by expert: rank d's block is experts 2d, 2d+1

    sent_counts = torch.bincount(choice[kept], minlength=n_experts)  # [E]: tokens for each expert
    received_counts = torch.empty_like(sent_counts)  # [world * local]: from each rank, for each of my experts
    dist.all_to_all_single(received_counts, sent_counts)
    send_splits = sent_counts.view(world, local).sum(1).tolist()
    recv_splits = received_counts.view(world, local).sum(1).tolist()

    tokens = AllToAll.apply(x[kept], dist, recv_splits, send_splits)  # [sum(recv_splits), d], by source
    chunks = tokens.split(received_counts.tolist())  # from rank 0 for my experts 0, 1, from rank 1 ..., by counts
    # each source rank's chunk for each of my experts through that expert, in the order the rows arrived
    results = torch.cat([F.gelu(chunk @ experts[i % local][0]) @ experts[i % local][1]
                         for i, chunk in enumerate(chunks)])

    returned = AllToAll.apply(results, dist, send_splits, recv_splits)  # [len(kept), d], in the order sent
    return x + torch.zeros_like(x).index_copy(0, kept, gate[kept].unsqueeze(1) * returned)
