"""p13 in another style: the ring runs the other way (every rank sends to rank r - 1 and receives from r + 1), and
recursive doubling pairs by distance instead of XOR (round k sends to r + 2^k and receives from r - 2^k: after
log2 N rounds each rank has summed 2^k consecutive ranks' tensors, all N of them; the dissemination pattern)."""

import torch


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    to, frm = (r - 1) % n, (r + 1) % n
    chunks = t.view(-1).chunk(n)
    buf = torch.empty_like(chunks[0])
    for k in range(n - 1):
        out = dist.isend(chunks[(r + k) % n], to)
        dist.irecv(buf, frm).wait()
        out.wait()
        chunks[(r + k + 1) % n].add_(buf)
    for k in range(n - 1):
        out = dist.isend(chunks[(r - 1 + k) % n], to)
        dist.irecv(chunks[(r + k) % n], frm).wait()
        out.wait()


def recursive_doubling_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    buf = torch.empty_like(t)
    distance = 1
    while distance < n:
        works = [dist.irecv(buf, (r - distance) % n), dist.isend(t, (r + distance) % n)]
        for w in works:
            w.wait()
        t.add_(buf)
        distance *= 2
