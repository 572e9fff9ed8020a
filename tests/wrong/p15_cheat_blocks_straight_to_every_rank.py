"""p15 cheat (issue 29): never round the ring. At step s each rank sends its own K/V block straight to rank r+s+1
(and receives rank r-s-1's straight from it), in forward and again in backward, and every dK/dV part goes straight
to the block's owner. The same bytes, the same blocks held, the same overlap: no check read who sent to whom, and it
passed. A block now goes to a ring neighbour in forward; at N = 4 the sends to r+2 are off the ring."""


import torch

from puzzles.model import attention_tile, attention_tile_backward

MISTAKE = "each rank's own K/V block sent straight to every other rank, and every dK/dV straight home: no ring"
EXPECTED_FAILURES = {"forward communication"}
DIAGNOSIS = "which are not its ring neighbours"


def load_balanced_chunks(rank, world_size):
    return 2 * world_size - 1 - rank, rank


def merge(out, lse, tile_out, tile_lse):
    total = torch.logaddexp(lse, tile_lse)
    weight = torch.exp(lse - total)
    return weight * out + (1 - weight) * tile_out, total  # the tile's weight is what the old one's is not


def tiles(mine, theirs):
    """(my query chunk, their key chunk, diagonal) for each tile that the causal mask leaves something in."""
    return [(i, j, theirs[j] == mine[i]) for i in range(2) for j in range(2) if theirs[j] <= mine[i]]


def halves(t):
    return t.chunk(2, dim=-2)


def exchange(dist, block, rank, world, step=1):
    """My own block straight to rank r+s+1, and rank r-s-1's straight from it: never round the ring."""
    arriving = [torch.empty_like(t) for t in block]
    works = [dist.isend(t, (rank + step + 1) % world) for t in block]
    works += [dist.irecv(t, (rank - step - 1) % world) for t in arriving]
    return arriving, works


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dist):
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = load_balanced_chunks(rank, world)
        merged = [None, None]

        def attend(block, theirs):
            for i, j, diagonal in tiles(mine, theirs):
                part = attention_tile(halves(q)[i], halves(block[0])[j], halves(block[1])[j], diagonal)
                merged[i] = part if merged[i] is None else merge(*merged[i], *part)

        block = [k, v]
        for step in range(world):
            if step < world - 1:
                arriving, works = exchange(dist, [k, v], rank, world, step)
            attend(block, load_balanced_chunks((rank - step) % world, world))
            if step < world - 1:
                for work in works:
                    work.wait()
                block, works = arriving, None
        out, lse = (torch.cat(t, dim=-2) for t in zip(*merged))
        ctx.dist = dist
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dist = ctx.dist
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = load_balanced_chunks(rank, world)
        dq = torch.zeros_like(q)

        def gradient_of(block, theirs):
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
            for i, j, diagonal in tiles(mine, theirs):
                a, b, c = attention_tile_backward(halves(q)[i], halves(block[0])[j], halves(block[1])[j],
                                                  halves(out)[i], halves(lse)[i], halves(grad_out)[i], diagonal)
                halves(dq)[i].add_(a)
                halves(dk)[j].add_(b)
                halves(dv)[j].add_(c)
            return dk, dv

        def settle(part):
            """Wait for a part of my block's gradient and add it to what stays home."""
            buffers, works = part
            for work in works:
                work.wait()
            home[0].add_(buffers[0])
            home[1].add_(buffers[1])

        block, home, part, sends = [k, v], None, None, []
        for step in range(world):
            owner = (rank - step) % world
            if step < world - 1:
                arriving, works = exchange(dist, [k, v], rank, world, step)
            grads = gradient_of(block, load_balanced_chunks(owner, world))
            if step == 0:
                home = grads
            else:
                if part is not None:
                    settle(part)
                for work in sends:
                    work.wait()
                # Tag 1 keeps the gradients apart from the K/V blocks (tag 0); rank r+s computes its part of my
                # block at its step s, as I compute mine of rank r-s's.
                sends = [dist.isend(g, owner, tag=1) for g in grads]
                buffers = (torch.empty_like(k), torch.empty_like(v))
                part = (buffers, [dist.irecv(t, (rank + step) % world, tag=1) for t in buffers])
                del buffers
            del grads
            if step < world - 1:
                for work in works:
                    work.wait()
                block, works = arriving, None
        settle(part)
        for work in sends:
            work.wait()
        return dq, home[0], home[1], None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape
    heads = [t.reshape(b, s, n_heads, d // n_heads).transpose(1, 2).contiguous() for t in (x @ wqkv).split(d, -1)]
    out = RingAttention.apply(*heads, dist)
    return torch.einsum("bhsk,hkd->bsd", out, wo.view(n_heads, d // n_heads, d))
