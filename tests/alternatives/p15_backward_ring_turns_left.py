"""p15, another style: the forward's ring turns right (rank r sends to r+1), the backward's turns left: each block
goes to r-1 with its gradient's travelling sum one step behind it, so at backward step s a rank holds rank
r+s's block. Every message still goes to a ring neighbour; the direction is each phase's own choice."""

import torch

from puzzles.model import attention_tile, attention_tile_backward


def load_balanced_chunks(rank, world_size):
    return rank, 2 * world_size - 1 - rank


def merge(out, lse, tile_out, tile_lse):
    total = torch.logaddexp(lse, tile_lse)
    return torch.exp(lse - total) * out + torch.exp(tile_lse - total) * tile_out, total


def wait_all(works):
    """Wait for every handle. (In a function of its own, so that no name is left holding the last one: a finished
    handle may still hold its buffer, as gloo's do.)"""
    for work in works:
        work.wait()


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dist):
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        mine = load_balanced_chunks(rank, world)
        outs, lses = [None, None], [None, None]  # per query chunk: its tiles so far, merged
        block = (k, v)
        for step in range(world):
            theirs = load_balanced_chunks((rank - step) % world, world)  # the chunks of the block I hold
            if step < world - 1:  # the next block arrives while I compute with this one
                arriving = (torch.empty_like(k), torch.empty_like(v))
                works = [dist.isend(block[0], right), dist.isend(block[1], right),
                         dist.irecv(arriving[0], left), dist.irecv(arriving[1], left)]
            for i, j in [(i, j) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]:
                out, lse = attention_tile(q.chunk(2, dim=-2)[i], block[0].chunk(2, dim=-2)[j],
                                          block[1].chunk(2, dim=-2)[j], theirs[j] == mine[i])
                outs[i], lses[i] = (out, lse) if outs[i] is None else merge(outs[i], lses[i], out, lse)
            if step < world - 1:
                wait_all(works)
                block, works = arriving, None  # the block I sent goes: nothing refers to it any more
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)
        ctx.dist = dist
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dist = ctx.dist
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank - 1) % world, (rank + 1) % world  # backward's ring turns the other way
        mine = load_balanced_chunks(rank, world)
        dq = torch.zeros_like(q)
        block, home, arriving_grad, leaving = (k, v), None, None, None
        for step in range(world):
            theirs = load_balanced_chunks((rank + step) % world, world)  # the block from `step` ranks on
            if step < world - 1:
                arriving = (torch.empty_like(k), torch.empty_like(v))
                works = [dist.isend(block[0], right), dist.isend(block[1], right),
                         dist.irecv(arriving[0], left), dist.irecv(arriving[1], left)]
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # this block's gradient from my queries
            for i, j in [(i, j) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]:
                grads = attention_tile_backward(
                    q.chunk(2, dim=-2)[i], block[0].chunk(2, dim=-2)[j], block[1].chunk(2, dim=-2)[j],
                    out.chunk(2, dim=-2)[i], lse.chunk(2, dim=-2)[i], grad_out.chunk(2, dim=-2)[i], theirs[j] == mine[i])
                dq.chunk(2, dim=-2)[i].add_(grads[0])
                dk.chunk(2, dim=-2)[j].add_(grads[1])
                dv.chunk(2, dim=-2)[j].add_(grads[2])
            if step == 0:
                home = (dk, dv)  # my own block's gradient from my own queries: it stays here
            else:
                if arriving_grad is not None:  # what the ranks before me added to this block's gradient
                    wait_all(grad_works)
                    dk += arriving_grad[0]
                    dv += arriving_grad[1]
                    grad_works = None  # a finished handle may still hold its buffer (gloo's do): let them go
                if leaving is not None:
                    wait_all(leaving)
                leaving = [dist.isend(dk, right), dist.isend(dv, right)]  # on; after the last step, home
                arriving_grad = (torch.empty_like(k), torch.empty_like(v))
                grad_works = [dist.irecv(arriving_grad[0], left), dist.irecv(arriving_grad[1], left)]
            if step < world - 1:
                wait_all(works)
                block, works = arriving, None
        wait_all(grad_works + leaving)
        del grad_works, leaving
        return dq, home[0] + arriving_grad[0], home[1] + arriving_grad[1], None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape
    q, k, v = (x @ wqkv).split(d, dim=-1)

    def heads(t):  # [b, s, d] -> [b, heads, s, hd], contiguous: it is sent as it is
        return t.view(b, s, n_heads, d // n_heads).transpose(1, 2).contiguous()

    out = RingAttention.apply(heads(q), heads(k), heads(v), dist)
    return out.transpose(1, 2).reshape(b, s, d) @ wo
