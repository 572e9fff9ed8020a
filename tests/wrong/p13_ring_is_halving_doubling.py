"""p13 mistake: ring_all_reduce written as recursive halving then doubling (Rabenseifner's all-reduce): a correct
all-reduce with the ring's bytes and fewer latencies, but not a ring: each rank sends to ranks r ^ 1, r ^ 2, ...
instead of only its neighbours, and its first receive buffer is half the tensor, not one chunk."""

import torch

MISTAKE = "ring_all_reduce is recursive halving and doubling, not a ring"
EXPECTED_FAILURES = {"ring bytes", "ring memory"}
DIAGNOSIS = "which are not its ring neighbours"


def ring_all_reduce(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    flat = t.view(-1)
    lo, hi = 0, flat.numel()
    step = n // 2
    spans = []
    while step >= 1:  # halving: keep the half of [lo, hi) on the partner's side opposite
        partner, mid = r ^ step, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if r & step == 0 else ((mid, hi), (lo, mid))
        buf = torch.empty(keep[1] - keep[0], dtype=t.dtype)
        works = [dist.isend(flat[give[0]:give[1]], partner), dist.irecv(buf, partner)]
        for w in works:
            w.wait()
        flat[keep[0]:keep[1]] += buf
        del buf
        spans.append((partner, keep, give))
        lo, hi = keep
        step //= 2
    for partner, keep, give in reversed(spans):  # doubling: give the partner back the half it gave away
        works = [dist.isend(flat[keep[0]:keep[1]], partner), dist.irecv(flat[give[0]:give[1]], partner)]
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
