"""p13 mistake: the reduce-scatter runs N-2 steps instead of N-1 (range(n - 2)): the chunk each rank finishes
lacks one rank's part, and the all-gather spreads those incomplete chunks to everyone. One chunk fewer is sent."""

import torch

MISTAKE = "the ring's reduce-scatter stops one step short"
EXPECTED_FAILURES = {"ring values", "ring bytes"}
DIAGNOSIS = "lacks rank"


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunks = t.view(-1).chunk(n)
    buf = torch.empty_like(chunks[0])
    for k in range(n - 2):  # the mistake: n - 1 steps are needed
        works = [dist.isend(chunks[(r - k) % n], right), dist.irecv(buf, left)]
        for w in works:
            w.wait()
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        works = [dist.isend(chunks[(r + 1 - k) % n], right), dist.irecv(chunks[(r - k) % n], left)]
        for w in works:
            w.wait()


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
