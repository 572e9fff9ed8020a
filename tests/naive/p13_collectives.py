"""Naive p13: gather everything, then sum. Each rank sends its whole tensor to every other rank and adds up what it
receives: right values, and no collective, but (N-1)·S bytes sent per rank where the ring sends 2(N-1)/N·S and
recursive doubling log2(N)·S, N-1 tensors held at once, and N-1 whole messages on each rank's link in turn."""

import torch

EXPECTED_FAILURES = {"ring bytes", "ring makespan", "ring memory", "doubling bytes", "doubling makespan",
                     "doubling memory"}
DIAGNOSIS = "gather everything, then sum"


def gather_everything_then_sum(dist, t):
    n, r = dist.get_world_size(), dist.get_rank()
    others = [s for s in range(n) if s != r]
    received = [torch.empty_like(t) for _ in others]
    ops = [dist.P2POp(dist.isend, t, s) for s in others] + [dist.P2POp(dist.irecv, buf, s)
                                                           for s, buf in zip(others, received)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for buf in received:
        t += buf


def ring_all_reduce(dist, t):
    gather_everything_then_sum(dist, t)


def recursive_doubling_all_reduce(dist, t):
    gather_everything_then_sum(dist, t)
