"""p13 mistake: the ring stops after its reduce-scatter. Each rank holds one chunk complete (the one it finished)
and partial sums in the others; half the bytes are sent."""

import torch

MISTAKE = "the ring's all-gather is missing: only the reduce-scatter runs"
EXPECTED_FAILURES = {"ring values", "ring bytes"}
DIAGNOSIS = "the all-gather did not bring it the others"


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
