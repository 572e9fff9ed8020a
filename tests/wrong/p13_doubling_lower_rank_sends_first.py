"""p13 mistake: recursive doubling with blocking calls, the lower rank of each pair sending first and the higher
receiving first (safe: no deadlock). The values and bytes are right, but each round carries the two messages one
after the other instead of both ways at once: twice doubling's time."""

import torch

MISTAKE = "blocking send and recv in turn in each doubling round: the two directions never overlap"
EXPECTED_FAILURES = {"doubling makespan"}
DIAGNOSIS = "never overlapped"


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
        partner = r ^ step
        if r < partner:
            dist.send(t, partner)
            dist.recv(buf, partner)
        else:
            dist.recv(buf, partner)
            dist.send(t, partner)
        t += buf
        step *= 2
