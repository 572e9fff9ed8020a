"""p13 mistake: recursive doubling adds into t as soon as the partner's tensor has arrived, without waiting for its
own send of t to finish: t changes while it may still be on its way (the simulator refuses a buffer written while
an async op still reads it; on real hardware the partner could receive a half-updated sum)."""

import torch

MISTAKE = "t is written before the isend that reads it has been waited for"
EXPECTED_STATUS = "error"
DIAGNOSIS = "InFlightError"


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
        sending = dist.isend(t, r ^ step)
        dist.irecv(buf, r ^ step).wait()
        t += buf  # the mistake: t is still being sent
        sending.wait()
        step *= 2
