"""p13 in another style: a fresh zeroed receive buffer every step, the all-gather received into a buffer and then
copied into place, an isend with a blocking recv, and the sum written with torch.add(..., out=t): an allocation and
a copy per step cost their memory traffic on the clock, well within the makespan's 10%."""

import torch


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = list(t.view(-1).chunk(n))
    for k in range(n - 1):
        buf = torch.zeros_like(chunks[0])
        out = dist.isend(chunks[(r - k) % n], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        out.wait()
        chunks[(r - k - 1) % n] += buf
    for k in range(n - 1):
        buf = torch.zeros_like(chunks[0])
        out = dist.isend(chunks[(r + 1 - k) % n], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        out.wait()
        chunks[(r - k) % n].copy_(buf)


def recursive_doubling_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    buf = torch.zeros_like(t)
    step = 1
    while step < n:
        out = dist.isend(t, r ^ step)
        dist.recv(buf, r ^ step)
        out.wait()
        torch.add(t, buf, out=t)
        step <<= 1
