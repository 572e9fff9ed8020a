"""p15 naive: all-gather K and V, then attend to every block at once. The values, the split, the compute and the
bytes are right (an all-gather and a reduce-scatter move what the ring moves), but every rank holds all N K/V
blocks (saved for backward too), and nothing overlaps: the gather comes before the first tile and the
reduce-scatter after the last."""

import torch

from puzzles.model import attention_tile, attention_tile_backward

EXPECTED_FAILURES = {"K/V blocks", "forward memory", "forward communication", "backward communication",
                     "makespan"}
DIAGNOSIS = "gathered every rank's keys and values"


def load_balanced_chunks(rank, world_size):
    return rank, 2 * world_size - 1 - rank


def merge(out, lse, tile_out, tile_lse):
    total = torch.logaddexp(lse, tile_lse)
    return torch.exp(lse - total) * out + torch.exp(tile_lse - total) * tile_out, total


def pairs(rank, world):
    """(my query chunk i, rank r, its key chunk j, diagonal) for every tile my queries see."""
    mine = load_balanced_chunks(rank, world)
    return [(i, r, j, theirs[j] == mine[i]) for r in range(world)
            for theirs in [load_balanced_chunks(r, world)] for i in range(2) for j in range(2) if theirs[j] <= mine[i]]


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dist):
        world = dist.get_world_size()
        ks, vs = q.new_empty((world, *k.shape)), q.new_empty((world, *v.shape))
        dist.all_gather_into_tensor(ks.view(-1), k.view(-1))  # flat: gloo takes the ranks' tensors end to end
        dist.all_gather_into_tensor(vs.view(-1), v.view(-1))
        outs, lses = [None, None], [None, None]
        for i, r, j, diagonal in pairs(dist.get_rank(), world):
            out, lse = attention_tile(q.chunk(2, dim=-2)[i], ks[r].chunk(2, dim=-2)[j], vs[r].chunk(2, dim=-2)[j],
                                      diagonal)
            outs[i], lses[i] = (out, lse) if outs[i] is None else merge(outs[i], lses[i], out, lse)
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)
        ctx.dist = dist
        ctx.save_for_backward(q, ks, vs, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, ks, vs, out, lse = ctx.saved_tensors
        dist = ctx.dist
        dq, dks, dvs = torch.zeros_like(q), torch.zeros_like(ks), torch.zeros_like(vs)
        for i, r, j, diagonal in pairs(dist.get_rank(), dist.get_world_size()):
            a, b, c = attention_tile_backward(q.chunk(2, dim=-2)[i], ks[r].chunk(2, dim=-2)[j],
                                              vs[r].chunk(2, dim=-2)[j], out.chunk(2, dim=-2)[i],
                                              lse.chunk(2, dim=-2)[i], grad_out.chunk(2, dim=-2)[i], diagonal)
            dq.chunk(2, dim=-2)[i].add_(a)
            dks[r].chunk(2, dim=-2)[j].add_(b)
            dvs[r].chunk(2, dim=-2)[j].add_(c)
        dk, dv = torch.empty_like(q), torch.empty_like(q)
        dist.reduce_scatter_tensor(dk.view(-1), dks.view(-1))
        dist.reduce_scatter_tensor(dv.view(-1), dvs.view(-1))
        return dq, dk, dv, None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape
    q, k, v = (x @ wqkv).split(d, dim=-1)

    def heads(t):
        return t.view(b, s, n_heads, d // n_heads).transpose(1, 2).contiguous()

    out = RingAttention.apply(heads(q), heads(k), heads(v), dist)
    return out.transpose(1, 2).reshape(b, s, d) @ wo
