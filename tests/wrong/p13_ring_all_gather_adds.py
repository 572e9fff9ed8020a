"""p13 mistake: the all-gather adds what arrives into t, as the reduce-scatter does, instead of copying it in. A
complete chunk added onto the partial sum that was there counts some ranks' parts twice."""

import torch

MISTAKE = "the ring's all-gather adds the complete chunks instead of writing them"
EXPECTED_FAILURES = {"ring values"}
DIAGNOSIS = "a part was added more than once"


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
    for k in range(n - 1):
        works = [dist.isend(chunks[(r + 1 - k) % n], right), dist.irecv(buf, left)]
        for w in works:
            w.wait()
        chunks[(r - k) % n].add_(buf)  # the mistake: the chunk arrives complete; copy_ it


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
