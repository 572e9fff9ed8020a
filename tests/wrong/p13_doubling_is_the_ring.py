"""p13 mistake: recursive_doubling_all_reduce calls the ring. The values are right, but it sends the ring's
2(N-1)/N·S bytes in 2(N-1) steps, where recursive doubling sends the whole tensor log2 N times; at 4 KiB the ring's
2(N-1) latencies are slower than doubling's budget."""

import torch

MISTAKE = "recursive_doubling_all_reduce is the ring"
EXPECTED_FAILURES = {"doubling bytes", "doubling makespan"}
DIAGNOSIS = "the ring's bytes"


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
    ring_all_reduce(dist, t)
