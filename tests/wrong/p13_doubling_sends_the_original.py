"""p13 mistake: recursive doubling keeps a copy of the rank's original tensor and sends that every round, adding
what arrives into t. Each rank ends with its own tensor plus its log2 N partners' originals: log2(N) + 1 of the N,
not the sum."""

import torch

MISTAKE = "each doubling round sends the original tensor, not the running sum"
EXPECTED_FAILURES = {"doubling values"}
DIAGNOSIS = "as they were at the start"


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
    mine = t.clone()  # the mistake: what is sent every round
    buf = torch.empty_like(t)
    step = 1
    while step < n:
        works = [dist.isend(mine, r ^ step), dist.irecv(buf, r ^ step)]
        for w in works:
            w.wait()
        t += buf
        step *= 2
