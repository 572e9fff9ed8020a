"""p12, another style: the counts are one number per rank, not per expert, and each token's expert travels with it
as a label (an int64 all-to-all of the same splits: 8 bytes per token, within the budget's 1 KiB); the dispatch
builds each destination's block with a boolean mask instead of sorting; the receiving rank picks each expert's rows
by label, and skips an expert no token reached (whose weights then have no .grad: a zero gradient)."""

import math

import torch
import torch.nn.functional as F


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist, output_split_sizes, input_split_sizes):
        ctx.dist, ctx.splits = dist, (output_split_sizes, input_split_sizes)
        out = torch.empty((sum(output_split_sizes), x.shape[1]), dtype=x.dtype)
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes, input_split_sizes)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = torch.empty((sum(in_splits), grad.shape[1]), dtype=grad.dtype)
        ctx.dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None, None


def moe_forward(dist, x, router, experts, capacity_factor):
    world, local = dist.get_world_size(), len(experts)
    n_experts = world * local
    capacity = math.ceil(capacity_factor * x.shape[0] / n_experts)
    probs = torch.softmax(x @ router, dim=-1)
    p, e = probs.max(dim=-1)
    seen = F.one_hot(e, n_experts).cumsum(0).gather(1, e.unsqueeze(1)).squeeze(1)  # 1 for an expert's first token
    kept = seen <= capacity
    dest = e // local
    blocks = [torch.nonzero(kept & (dest == r)).squeeze(1) for r in range(world)]
    index = torch.cat(blocks)
    send = torch.tensor([len(b) for b in blocks])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_splits, recv_splits = send.tolist(), recv.tolist()

    labels = torch.empty(sum(recv_splits), dtype=torch.long)
    dist.all_to_all_single(labels, e[index] - dest[index] * local, recv_splits, send_splits)
    arrived = AllToAll.apply(x[index], dist, recv_splits, send_splits)
    done = torch.zeros_like(arrived)
    for j, (w1, w2) in enumerate(experts):
        mine = torch.nonzero(labels == j).squeeze(1)
        if len(mine) == 0:  # no token for this expert: skip it (its weights then get no .grad at all)
            continue
        done = done.index_copy(0, mine, F.gelu(arrived[mine] @ w1) @ w2)
    back = AllToAll.apply(done, dist, send_splits, recv_splits)
    return x + torch.zeros_like(x).index_copy(0, index, p[index].unsqueeze(1) * back)
