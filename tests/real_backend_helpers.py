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
