"""p15 mistake: backward passes the K/V blocks around but keeps each block's dK/dV where it was computed: a rank's
own dk/dv hold only its own queries' part, the other ranks' parts never come home."""

import torch

from puzzles.model import attention_tile, attention_tile_backward

MISTAKE = "dK/dV never sent home: each block's gradient holds only its own rank's queries' part"
EXPECTED_FAILURES = {"backward communication", "input gradient", "q/k/v gradients"}
DIAGNOSIS = "never came home"


def load_balanced_chunks(rank, world_size):
    return rank, 2 * world_size - 1 - rank


def merge(out, lse, tile_out, tile_lse):
    total = torch.logaddexp(lse, tile_lse)
    return torch.exp(lse - total) * out + torch.exp(tile_lse - total) * tile_out, total


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
                for work in works:
                    work.wait()
                block, works = arriving, None  # the block I sent goes (a finished handle may still hold it)
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)
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
        block, home = (k, v), None
        for step in range(world):
            theirs = load_balanced_chunks((rank - step) % world, world)
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
                pass  # the other blocks' gradients from my queries: dropped here
            if step < world - 1:
                for work in works:
                    work.wait()
                block, works = arriving, None
        return dq, home[0], home[1], None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape
    q, k, v = (x @ wqkv).split(d, dim=-1)

    def heads(t):  # [b, s, d] -> [b, heads, s, hd], contiguous: it is sent as it is
        return t.view(b, s, n_heads, d // n_heads).transpose(1, 2).contiguous()

    out = RingAttention.apply(heads(q), heads(k), heads(v), dist)
    return out.transpose(1, 2).reshape(b, s, d) @ wo
