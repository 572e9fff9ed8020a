"""p15 mistake: the forward keeps every block it receives, saved for backward, which then needs no K/V ring: it
computes all dK/dV at once and sends each block's gradient straight home. Values and forward bytes are right; the
rank holds all N blocks (and the backward sends only the dK/dV)."""

import torch

from puzzles.model import attention_tile, attention_tile_backward

MISTAKE = "received K/V blocks kept for backward (all N held): no second ring"
EXPECTED_FAILURES = {"K/V blocks", "backward communication", "forward memory", "makespan"}
DIAGNOSIS = "kept the K/V blocks it received"


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
        kept = [block]
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
                block, works = arriving, None
                kept.append(block)
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)
        ctx.dist = dist
        ctx.save_for_backward(q, out, lse, *[t for pair in kept for t in pair])
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, out, lse, *blocks = ctx.saved_tensors
        dist = ctx.dist
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = load_balanced_chunks(rank, world)
        dq = torch.zeros_like(q)
        sends, home = [], None
        for step in range(world):
            theirs = load_balanced_chunks((rank - step) % world, world)
            block = (blocks[2 * step], blocks[2 * step + 1])
            k, v = block
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # this block's gradient from my queries
            for i, j in [(i, j) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]:
                grads = attention_tile_backward(
                    q.chunk(2, dim=-2)[i], block[0].chunk(2, dim=-2)[j], block[1].chunk(2, dim=-2)[j],
                    out.chunk(2, dim=-2)[i], lse.chunk(2, dim=-2)[i], grad_out.chunk(2, dim=-2)[i], theirs[j] == mine[i])
                dq.chunk(2, dim=-2)[i].add_(grads[0])
                dk.chunk(2, dim=-2)[j].add_(grads[1])
                dv.chunk(2, dim=-2)[j].add_(grads[2])
            if step == 0:
                home = (dk, dv)
            else:  # straight home to the block's owner
                owner = (rank - step) % world
                sends += [dist.isend(dk, owner), dist.isend(dv, owner)]
        came = []
        for step in range(1, world):  # every other rank's part of my block, from each of them
            parts = (torch.empty_like(home[0]), torch.empty_like(home[1]))
            sends += [dist.irecv(parts[0], (rank + step) % world), dist.irecv(parts[1], (rank + step) % world)]
            came.append(parts)
        for work in sends:
            work.wait()
        return dq, home[0] + sum(p[0] for p in came), home[1] + sum(p[1] for p in came), None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape
    q, k, v = (x @ wqkv).split(d, dim=-1)

    def heads(t):  # [b, s, d] -> [b, heads, s, hd], contiguous: it is sent as it is
        return t.view(b, s, n_heads, d // n_heads).transpose(1, 2).contiguous()

    out = RingAttention.apply(heads(q), heads(k), heads(v), dist)
    return out.transpose(1, 2).reshape(b, s, d) @ wo
