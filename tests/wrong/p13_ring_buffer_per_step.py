"""p13 mistake: the ring receives every step of its reduce-scatter into a buffer of its own, kept in a list: N-1
chunk-sized buffers alive at once where one, reused, would do."""

import torch

MISTAKE = "a new receive buffer for every ring step, all kept alive"
EXPECTED_FAILURES = {"ring memory"}
DIAGNOSIS = "chunks of S/N"


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunks = t.view(-1).chunk(n)
    received = []
    for k in range(n - 1):
        received.append(torch.empty_like(chunks[0]))  # the mistake: one buffer reused would do
        works = [dist.isend(chunks[(r - k) % n], right), dist.irecv(received[-1], left)]
        for w in works:
            w.wait()
        chunks[(r - k - 1) % n].add_(received[-1])
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
