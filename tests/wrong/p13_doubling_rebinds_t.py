"""p13 mistake: recursive doubling writes `t = t + buf`, which makes a new tensor and binds the name t to it: the
running sum is right inside the function, but the caller's t never changes (an all-reduce works in place), and
every round makes another tensor the size of t."""

import torch

MISTAKE = "t = t + buf rebinds the name: the caller's tensor is never written"
EXPECTED_FAILURES = {"doubling values", "doubling memory"}
DIAGNOSIS = "t is unchanged"


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
        t = t + buf  # the mistake: a new tensor; the caller's t is never written
        step *= 2
    return t
