"""p15, another style: the online softmax as flash attention writes it, with a running max m, a running sum l of
exp(score - m) and an unnormalised output acc per query, rescaled by exp(m_old - m_new) whenever the max grows;
out = acc / l and lse = m + log(l) at the end. The tiles' scores are computed here (the given attention_tile is
not used), and the K/V block travels as one [2, b, heads, S/N, hd] tensor: one message per step."""

import math

import torch

from puzzles.model import attention_tile_backward


def load_balanced_chunks(rank, world_size):
    return rank, 2 * world_size - 1 - rank


def merge(out, lse, tile_out, tile_lse):  # not used: the running max and sum do its work
    total = torch.logaddexp(lse, tile_lse)
    return torch.exp(lse - total) * out + torch.exp(tile_lse - total) * tile_out, total


def visible(mine, theirs):
    return [(i, j) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dist):
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = load_balanced_chunks(rank, world)
        shape = (*q.shape[:-2], q.shape[-2] // 2, 1)
        m = [torch.full(shape, float("-inf"), dtype=q.dtype) for _ in range(2)]  # running max per query
        l = [torch.zeros(shape, dtype=q.dtype) for _ in range(2)]  # running sum of exp(score - m)
        acc = [torch.zeros_like(q.chunk(2, dim=-2)[0]) for _ in range(2)]  # running sum of exp(score - m)·v
        block = torch.stack([k, v])
        for step in range(world):
            if step < world - 1:
                arriving = torch.empty_like(block)
                works = dist.batch_isend_irecv([dist.P2POp(dist.isend, block, (rank + 1) % world),
                                                dist.P2POp(dist.irecv, arriving, (rank - 1) % world)])
            theirs = load_balanced_chunks((rank - step) % world, world)
            for i, j in visible(mine, theirs):
                scores = q.chunk(2, dim=-2)[i] @ block[0].chunk(2, dim=-2)[j].transpose(-2, -1) / math.sqrt(q.shape[-1])
                if theirs[j] == mine[i]:
                    scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
                new_max = torch.maximum(m[i], scores.amax(dim=-1, keepdim=True))
                shrink = torch.exp(m[i] - new_max)  # what the old sums are worth against the new max
                p = torch.exp(scores - new_max)
                l[i] = l[i] * shrink + p.sum(dim=-1, keepdim=True)
                acc[i] = acc[i] * shrink + p @ block[1].chunk(2, dim=-2)[j]
                m[i] = new_max
            if step < world - 1:
                for work in works:
                    work.wait()
                block = arriving
                del works
        out = torch.cat([a / s for a, s in zip(acc, l)], dim=-2)
        lse = torch.cat([mx + torch.log(s) for mx, s in zip(m, l)], dim=-2)
        ctx.dist = dist
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dist = ctx.dist
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        mine = load_balanced_chunks(rank, world)
        dq = torch.zeros_like(q)
        block = torch.stack([k, v])
        home = came = sending = None
        for step in range(world):
            works = []
            if step < world - 1:
                arriving = torch.empty_like(block)
                works = dist.batch_isend_irecv([dist.P2POp(dist.isend, block, right),
                                                dist.P2POp(dist.irecv, arriving, left)])
            theirs = load_balanced_chunks((rank - step) % world, world)
            grad = torch.zeros_like(block)  # [dK, dV] of the block I hold, from my queries
            for i, j in visible(mine, theirs):
                a, b, c = attention_tile_backward(
                    q.chunk(2, dim=-2)[i], block[0].chunk(2, dim=-2)[j], block[1].chunk(2, dim=-2)[j],
                    out.chunk(2, dim=-2)[i], lse.chunk(2, dim=-2)[i], grad_out.chunk(2, dim=-2)[i], theirs[j] == mine[i])
                dq.chunk(2, dim=-2)[i].add_(a)
                grad[0].chunk(2, dim=-2)[j].add_(b)
                grad[1].chunk(2, dim=-2)[j].add_(c)
            if step == 0:
                home = grad
            else:
                if came is not None:
                    came[1].wait()
                    grad += came[0]
                if sending is not None:
                    sending.wait()
                sending = dist.isend(grad, right)
                arriving_grad = torch.empty_like(block)
                came = (arriving_grad, dist.irecv(arriving_grad, left))
                del arriving_grad
            for work in works:
                work.wait()
            if step < world - 1:
                block = arriving
            del works, grad
        came[1].wait()
        sending.wait()
        total = home + came[0]
        return dq, total[0], total[1], None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape
    q, k, v = (x @ wqkv).view(b, s, 3, n_heads, d // n_heads).permute(2, 0, 3, 1, 4).contiguous()
    out = RingAttention.apply(q, k, v, dist)
    return out.transpose(1, 2).reshape(b, s, d) @ wo
