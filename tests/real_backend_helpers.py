"""Rank functions for tests/test_real_backend.py. They live in a module of their own, importable by name, because
each process of a real group imports the function it runs (a light module starts faster than a test file)."""

import os

import torch


def rank_raises(dist):
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    dist.all_reduce(torch.ones(3))
    return {}


def rank_dies(dist):
    if dist.get_rank() == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(3))
    return {}


def ranks_mismatch(dist):
    dist.all_reduce(torch.ones(3 + dist.get_rank()))
    return {}


def receive_then_add(dist):
    """Rank 1 receives into a buffer, then adds to it in place; then a reduce_scatter_tensor, whose result gloo
    copies into the output inside wait(). The clock must charge the add_ (the learner's) and not that copy_ (gloo's
    delivery)."""
    rank = dist.get_rank()
    buf = torch.zeros(64, dtype=torch.float64)
    if rank == 0:
        dist.isend(torch.ones(64, dtype=torch.float64), 1).wait()
    else:
        dist.irecv(buf, 0).wait()
        buf.add_(1.0)
    out = torch.empty(32, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, torch.ones(64, dtype=torch.float64), async_op=True).wait()
    return buf, out
