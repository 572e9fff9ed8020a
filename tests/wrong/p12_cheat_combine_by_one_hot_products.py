"""p12 cheat (issue 29): the reference, but the combine that puts each token's result back in its row is written as
one-hot outer products: a [n, K] mask of which kept row is whose, multiplied into the [K, d] results and summed.
As matmuls those products would be over the exact product count; as elementwise multiplies and sums (26,624 FLOPs,
and as many again in backward) they fit in the room the compute ceiling leaves for routing and for accumulating
gradients, so it passed. Elementwise work outside backward has only the routing's forward as room now."""

import math

import torch
import torch.nn.functional as F

MISTAKE = "the combine written as one-hot outer products (a mask multiplied in and summed) instead of an index"
EXPECTED_FAILURES = {"expert compute"}
DIAGNOSIS = "is a product all the same"


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
    whose = torch.arange(local).repeat(world).repeat_interleave(received_counts)  # each row's local expert
    by_expert = torch.argsort(whose, stable=True)
    outputs = torch.cat([F.gelu(part @ w1) @ w2 for part, (w1, w2) in
                         zip(tokens[by_expert].split(torch.bincount(whose, minlength=local).tolist()), experts)])
    results = outputs[torch.argsort(by_expert)]  # back in the order the rows arrived

    returned = AllToAll.apply(results, dist, send_splits, recv_splits)  # [len(kept), d], in the order sent
    where = F.one_hot(kept, n).to(x.dtype).T  # [n, K]: token i's row is 1 at the kept rows that are its
    return x + (where[:, :, None] * (gate[kept].unsqueeze(1) * returned)[None, :, :]).sum(1)  # one-hot outer products
