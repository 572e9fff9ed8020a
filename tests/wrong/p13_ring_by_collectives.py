"""p13 cheat: the ring written with the collectives it is made of, reduce_scatter_tensor then
all_gather_into_tensor. Values, bytes, time and memory are all what the ring's would be: only the rule that no
collective may be called catches it."""

import torch

MISTAKE = "the ring calls reduce_scatter_tensor and all_gather_into_tensor"
EXPECTED_FAILURES = {"no collective"}
DIAGNOSIS = "is a collective"


def ring_all_reduce(dist, t):
    flat = t.view(-1)
    mine = torch.empty(flat.numel() // dist.get_world_size(), dtype=t.dtype)
    dist.reduce_scatter_tensor(mine, flat)
    dist.all_gather_into_tensor(flat, mine)


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
