"""p15 mistake: each step computes the rank's queries against the whole block, all four tiles, and masks what the
causal mask hides (a large negative, so that rows that see nothing weigh zero): the values are right, but the
empty tiles are computed too, 16 tiles where the mask leaves 9."""

import torch

from puzzles.model import attention_tile, attention_tile_backward

MISTAKE = "every tile of every block computed under a mask, the empty ones too"
EXPECTED_FAILURES = {"compute", "makespan"}
DIAGNOSIS = "instead of skipping them"


def load_balanced_chunks(rank, world_size):
    return rank, 2 * world_size - 1 - rank


def merge(out, lse, tile_out, tile_lse):
    total = torch.logaddexp(lse, tile_lse)
    return torch.exp(lse - total) * out + torch.exp(tile_lse - total) * tile_out, total


def positions(chunks, c):
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunks])


def block_attention(q, k, v, mine, theirs):
    """My queries against a whole block, every tile computed, the causal mask from the positions (a large negative
    instead of -inf, so that a query that sees none of the block gets a weight of zero, not NaN)."""
    c = q.shape[-2] // 2
    hidden = positions(theirs, c)[None, :] > positions(mine, c)[:, None]
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(hidden, -1e30)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


def block_attention_backward(q, k, v, out, lse, grad_out, mine, theirs):
    c = q.shape[-2] // 2
    hidden = positions(theirs, c)[None, :] > positions(mine, c)[:, None]
    scale = q.shape[-1] ** -0.5
    p = torch.exp((q @ k.transpose(-2, -1) * scale).masked_fill(hidden, -1e30) - lse)
    ds = p * (grad_out @ v.transpose(-2, -1) - (grad_out * out).sum(dim=-1, keepdim=True)) * scale
    return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad_out


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
            out, lse = block_attention(q, block[0], block[1], mine, theirs)
            outs[0], lses[0] = (out, lse) if outs[0] is None else merge(outs[0], lses[0], out, lse)
            if step < world - 1:
                for work in works:
                    work.wait()
                block, works = arriving, None  # the block I sent goes (a finished handle may still hold it)
        out, lse = outs[0], lses[0]
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
        block, home, arriving_grad, leaving = (k, v), None, None, None
        for step in range(world):
            theirs = load_balanced_chunks((rank - step) % world, world)
            if step < world - 1:
                arriving = (torch.empty_like(k), torch.empty_like(v))
                works = [dist.isend(block[0], right), dist.isend(block[1], right),
                         dist.irecv(arriving[0], left), dist.irecv(arriving[1], left)]
            grads = block_attention_backward(q, block[0], block[1], out, lse, grad_out, mine, theirs)
            dq += grads[0]
            dk, dv = grads[1], grads[2]
            if step == 0:
                home = (dk, dv)  # my own block's gradient from my own queries: it stays here
            else:
                if arriving_grad is not None:  # what the ranks before me added to this block's gradient
                    for work in grad_works:
                        work.wait()
                    dk += arriving_grad[0]
                    dv += arriving_grad[1]
                if leaving is not None:
                    for work in leaving:
                        work.wait()
                leaving = [dist.isend(dk, right), dist.isend(dv, right)]  # on; after the last step, home
                arriving_grad = (torch.empty_like(k), torch.empty_like(v))
                grad_works = [dist.irecv(arriving_grad[0], left), dist.irecv(arriving_grad[1], left)]
            if step < world - 1:
                for work in works:
                    work.wait()
                block, works = arriving, None
        for work in grad_works + leaving:
            work.wait()
        return dq, home[0] + arriving_grad[0], home[1] + arriving_grad[1], None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape
    q, k, v = (x @ wqkv).split(d, dim=-1)

    def heads(t):  # [b, s, d] -> [b, heads, s, hd], contiguous: it is sent as it is
        return t.view(b, s, n_heads, d // n_heads).transpose(1, 2).contiguous()

    out = RingAttention.apply(heads(q), heads(k), heads(v), dist)
    return out.transpose(1, 2).reshape(b, s, d) @ wo
