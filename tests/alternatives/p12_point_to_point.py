"""p12, another style: no all_to_all_single for the tokens. The counts go out with the list form, `dist.all_to_all`
(one [2] tensor per rank: how many tokens for each of its two experts); the tokens and the results go pairwise with
isend/irecv posted together by batch_isend_irecv, in an autograd Function whose backward runs the same exchange the
other way; the tokens for this rank's own experts never leave it."""

import math

import torch
import torch.nn.functional as F


def exchange(dist, blocks, sizes_in, width):
    """blocks[r]: the rows for rank r; returns the rows from each rank (sizes_in[r] of them), by point to point."""
    me, ops, received = dist.get_rank(), [], []
    for r, block in enumerate(blocks):
        if r == me:
            received.append(block)
            continue
        buf = torch.empty(sizes_in[r], width, dtype=torch.float64)
        received.append(buf)
        if block.shape[0]:
            ops.append(dist.P2POp(dist.isend, block.contiguous(), r))
        if sizes_in[r]:
            ops.append(dist.P2POp(dist.irecv, buf, r))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return received


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dist, output_split_sizes, input_split_sizes):
        ctx.dist, ctx.splits = dist, (list(output_split_sizes), list(input_split_sizes))
        return torch.cat(exchange(dist, x.split(list(input_split_sizes)), list(output_split_sizes), x.shape[1]))

    @staticmethod
    def backward(ctx, grad):
        received, sent = ctx.splits
        return torch.cat(exchange(ctx.dist, grad.split(received), sent, grad.shape[1])), None, None, None


def moe_forward(dist, x, router, experts, capacity_factor):
    world, local = dist.get_world_size(), len(experts)
    n, n_experts = x.shape[0], world * local
    capacity = math.ceil(capacity_factor * n / n_experts)
    probs = torch.softmax(x @ router, dim=-1)
    choice = probs.argmax(dim=-1)
    gate = probs.gather(1, choice.unsqueeze(1))  # [n, 1]
    keep = torch.zeros(n, dtype=torch.bool)
    for e in range(n_experts):  # the first C tokens of each expert, in token order
        rows = torch.nonzero(choice == e).squeeze(1)
        keep[rows[:capacity]] = True
    order = torch.nonzero(keep).squeeze(1)
    order = order[torch.sort(choice[order], stable=True).indices]
    per_expert = torch.bincount(choice[order], minlength=n_experts).view(world, local)

    incoming = [torch.empty(local, dtype=per_expert.dtype) for _ in range(world)]
    dist.all_to_all(incoming, list(per_expert.unbind(0)))
    from_each = torch.stack(incoming)  # [world, local]: rows from each rank for each of my experts
    send_sizes, recv_sizes = per_expert.sum(1).tolist(), from_each.sum(1).tolist()

    tokens = AllToAll.apply(x[order], dist, recv_sizes, send_sizes)
    labels = torch.arange(local).repeat(world).repeat_interleave(from_each.reshape(-1))
    results = torch.zeros_like(tokens)
    for j, (w1, w2) in enumerate(experts):
        rows = torch.nonzero(labels == j).squeeze(1)
        results = results.index_copy(0, rows, F.gelu(tokens[rows] @ w1) @ w2)
    back = AllToAll.apply(results, dist, send_sizes, recv_sizes)
    out = torch.zeros_like(x).index_copy(0, order, back)
    return x + gate * out
