"""p13 mistake: every ring step sends the whole tensor and the receiver adds only the chunk it needs from it. The
values are right, but each rank sends 2(N-1)·S bytes instead of 2(N-1)/N·S, holds a receive buffer the size of t,
and every step takes a whole tensor's time on the link."""

import torch

MISTAKE = "each ring step sends the whole tensor, not one chunk"
EXPECTED_FAILURES = {"ring bytes", "ring makespan", "ring memory"}
DIAGNOSIS = "carried the whole tensor"


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunks = t.view(-1).chunk(n)
    buf = torch.empty_like(t)  # the mistake: room for all of t, which is what arrives
    for k in range(n - 1):
        works = [dist.isend(t, right), dist.irecv(buf, left)]
        for w in works:
            w.wait()
        j = (r - k - 1) % n
        chunks[j].add_(buf.view(-1).chunk(n)[j])
    for k in range(n - 1):
        works = [dist.isend(t, right), dist.irecv(buf, left)]
        for w in works:
            w.wait()
        j = (r - k) % n
        chunks[j].copy_(buf.view(-1).chunk(n)[j])


def recursive_doubling_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    buf = torch.empty_like(t)
    step = 1
    while step < n:
        works = [dist.isend(t, r ^ step), dist.irecv(buf, r ^ step)]
        for w in works:
            w.wait()
        t += buf
        step *= 2
