"""p15, another style: no tile loop. The own block (step 0) is computed whole, [2c x 2c] under one position mask
(its empty tile included: 4 tiles where 3 would do); after it, the two tiles a block leaves are one slice: a block
from a rank before mine (its first chunk is before both of mine) is seen by all my queries through its first chunk
alone, and a block from a rank after mine only by my second chunk, through both of its chunks. The merge works on
the whole [b, heads, 2c, hd] with an lse of -inf for the rows a slice does not reach. K and V travel through two
buffers allocated once per pass, in turn."""

import math

import torch


def load_balanced_chunks(rank, world_size):
    return rank, 2 * world_size - 1 - rank


def merge(out, lse, tile_out, tile_lse):
    total = torch.logaddexp(lse, tile_lse)
    return torch.exp(lse - total) * out + torch.exp(tile_lse - total) * tile_out, total


def own_mask(c):
    """[2c, 2c]: True where my query (chunk rank, then chunk 2N-1-rank) may not see my key."""
    pos = torch.cat([torch.arange(c), torch.arange(c) + 10 ** 6])  # only the order matters
    return pos[None, :] > pos[:, None]


def step_slices(rank, source, c):
    """(query rows, key rows, mask or None) of the part of block `source` my queries see."""
    if source == rank:
        return slice(None), slice(None), own_mask(c)
    if source < rank:  # its first chunk precedes both of mine; its second follows both
        return slice(None), slice(0, c), None
    return slice(c, None), slice(None), None  # only my late chunk sees it, all of it


def attend(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


def attend_backward(q, k, v, out, lse, grad_out, mask):
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    p = torch.exp(scores - lse)
    ds = p * (grad_out @ v.transpose(-2, -1) - (grad_out * out).sum(dim=-1, keepdim=True)) * scale
    return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad_out


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dist):
        rank, world = dist.get_rank(), dist.get_world_size()
        c = q.shape[-2] // 2
        out = torch.zeros_like(q)
        lse = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
        buffers = [torch.empty((2, *k.shape), dtype=k.dtype) for _ in range(2)]
        buffers[0][0].copy_(k)
        buffers[0][1].copy_(v)
        for step in range(world):
            now = buffers[step % 2]
            if step < world - 1:
                works = [dist.isend(now, (rank + 1) % world), dist.irecv(buffers[(step + 1) % 2], (rank - 1) % world)]
            rows, keys, mask = step_slices(rank, (rank - step) % world, c)
            part_out, part_lse = attend(q[..., rows, :], now[0][..., keys, :], now[1][..., keys, :], mask)
            out[..., rows, :], lse[..., rows, :] = merge(out[..., rows, :], lse[..., rows, :], part_out, part_lse)
            if step < world - 1:
                for work in works:
                    work.wait()
                del works
        del buffers, now
        ctx.dist = dist
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dist = ctx.dist
        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % world, (rank - 1) % world
        c = q.shape[-2] // 2
        dq = torch.zeros_like(q)
        buffers = [torch.empty((2, *k.shape), dtype=k.dtype) for _ in range(2)]
        buffers[0][0].copy_(k)
        buffers[0][1].copy_(v)
        home = came = leaving = None
        for step in range(world):
            now = buffers[step % 2]
            if step < world - 1:
                works = [dist.isend(now, right), dist.irecv(buffers[(step + 1) % 2], left)]
            rows, keys, mask = step_slices(rank, (rank - step) % world, c)
            grad = torch.zeros_like(now)  # [dK, dV] of the block I hold
            a, b, g = attend_backward(q[..., rows, :], now[0][..., keys, :], now[1][..., keys, :], out[..., rows, :],
                                      lse[..., rows, :], grad_out[..., rows, :], mask)
            dq[..., rows, :] += a
            grad[0][..., keys, :] += b
            grad[1][..., keys, :] += g
            del a, b, g
            if step == 0:
                home = grad
            else:
                if came is not None:
                    came[1].wait()
                    grad += came[0]
                if leaving is not None:
                    leaving.wait()
                leaving = dist.isend(grad, right)
                buffer = torch.empty_like(grad)
                came = (buffer, dist.irecv(buffer, left))
                del buffer
            del grad
            if step < world - 1:
                for work in works:
                    work.wait()
                del works
        came[1].wait()
        leaving.wait()
        home += came[0]
        return dq, home[0], home[1], None


def context_parallel_attention(dist, x, wqkv, wo, n_heads):
    b, s, d = x.shape
    hd = d // n_heads
    q, k, v = ((x @ wqkv[:, i * d:(i + 1) * d]).view(b, s, n_heads, hd).transpose(1, 2).contiguous()
               for i in range(3))
    return RingAttention.apply(q, k, v, dist).transpose(1, 2).reshape(b, s, d) @ wo
