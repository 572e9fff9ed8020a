"""p15, another style: another balanced pairing, rank r holding chunks N-1-r and N+r (they add up to 2N-1 too, so
every rank still sees 2N+1 tiles), and the whole ring written as a table first: for every step, which block the
rank holds and which of its tiles are seen, with their masks. Forward and backward walk the same table. The
messages and the waits are module-level helpers; dK/dV travel as in the reference, merged by the given formulas."""

import torch

from puzzles.model import attention_tile, attention_tile_backward


def load_balanced_chunks(rank, world_size):
    return world_size - 1 - rank, world_size + rank


def merge(out, lse, tile_out, tile_lse):
    top = torch.maximum(lse, tile_lse)  # the running max, taken out by hand
    a, b = torch.exp(lse - top), torch.exp(tile_lse - top)
    return (a * out + b * tile_out) / (a + b), top + torch.log(a + b)


def schedule(rank, world):
    """[(step, tiles)], tiles a list of (query half, key half, diagonal) for the block held at that step."""
    mine = load_balanced_chunks(rank, world)
    table = []
    for step in range(world):
        theirs = load_balanced_chunks((rank - step) % world, world)
        table.append((step, [(i, j, theirs[j] == mine[i]) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]))
    return table


def post(dist, sends, receives, to, source):
    return [dist.isend(t, to) for t in sends] + [dist.irecv(t, source) for t in receives]


def finish(works):
    for work in works or ():
        work.wait()


def half(t, i):
    c = t.shape[-2] // 2
    return t[..., i * c:(i + 1) * c, :]


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dist):
        rank, world = dist.get_rank(), dist.get_world_size()
        out = [None, None]
        kv = (k, v)
        for step, tiles in schedule(rank, world):
            nxt = works = None
            if step < world - 1:
                nxt = (torch.empty_like(k), torch.empty_like(v))
                works = post(dist, kv, nxt, (rank + 1) % world, (rank - 1) % world)
            for i, j, diagonal in tiles:
                got = attention_tile(half(q, i), half(kv[0], j), half(kv[1], j), diagonal)
                out[i] = got if out[i] is None else merge(*out[i], *got)
            finish(works)
            if nxt is not None:
                kv = nxt
            del nxt, works
        o = torch.cat([out[0][0], out[1][0]], dim=-2)
        lse = torch.cat([out[0][1], out[1][1]], dim=-2)
        ctx.dist = dist
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dist = ctx.dist
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        dq = torch.zeros_like(q)
        kv, home, incoming, outgoing = (k, v), None, None, None
        for step, tiles in schedule(rank, world):
            nxt = works = None
            if step < world - 1:
                nxt = (torch.empty_like(k), torch.empty_like(v))
                works = post(dist, kv, nxt, right, left)
            dkv = (torch.zeros_like(k), torch.zeros_like(v))
            for i, j, diagonal in tiles:
                gq, gk, gv = attention_tile_backward(half(q, i), half(kv[0], j), half(kv[1], j), half(o, i),
                                                     half(lse, i), half(do, i), diagonal)
                half(dq, i).add_(gq)
                half(dkv[0], j).add_(gk)
                half(dkv[1], j).add_(gv)
            if step == 0:
                home = dkv
            else:
                if incoming is not None:
                    finish(incoming[1])
                    dkv[0].add_(incoming[0][0])
                    dkv[1].add_(incoming[0][1])
                finish(outgoing)
                buffers = (torch.empty_like(k), torch.empty_like(v))
                outgoing = post(dist, dkv, (), right, left)
                incoming = (buffers, post(dist, (), buffers, right, left))
                del buffers
            del dkv
            finish(works)
            if nxt is not None:
                kv = nxt
            del nxt, works
        finish(incoming[1])
        finish(outgoing)
        return dq, home[0] + incoming[0][0], home[1] + incoming[0][1], None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape

    def heads(t):
        return t.unflatten(-1, (n_heads, d // n_heads)).permute(0, 2, 1, 3).contiguous()

    q, k, v = map(heads, (x @ wqkv).chunk(3, dim=-1))
    y = RingAttention.apply(q, k, v, dist)
    return y.permute(0, 2, 1, 3).flatten(2) @ wo
