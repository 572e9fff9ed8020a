"""p13 in another style: the ring's reduce-scatter passes chunks to the right and its all-gather passes the complete
chunks back to the left (a ring may run either way round, each phase too), and recursive doubling makes a fresh
receive buffer every round (two tensors' worth alive for a moment, within the memory budget)."""

import torch


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunks = t.view(-1).chunk(n)
    buf = torch.empty_like(chunks[0])
    for k in range(n - 1):
        works = [dist.isend(chunks[(r - k) % n], right), dist.irecv(buf, left)]
        for w in works:
            w.wait()
        chunks[(r - k - 1) % n].add_(buf)
    # chunk r + 1 is complete here; leftwards, step k sends chunk r + 1 + k and receives chunk r + 2 + k
    for k in range(n - 1):
        works = [dist.isend(chunks[(r + 1 + k) % n], left), dist.irecv(chunks[(r + 2 + k) % n], right)]
        for w in works:
            w.wait()


def recursive_doubling_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    step = 1
    while step < n:
        buf = torch.empty_like(t)
        works = [dist.isend(t, r ^ step), dist.irecv(buf, r ^ step)]
        for w in works:
            w.wait()
        t += buf
        step *= 2
