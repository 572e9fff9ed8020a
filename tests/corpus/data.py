"""Inputs for the corpus' rank programs: each rank's own values, the same wherever they are made."""

import torch


def randn(dist, *shape, salt: int = 0, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + salt)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def randint(dist, *shape, low: int = -20, high: int = 20, salt: int = 0, dtype=torch.int64) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + salt)
    return torch.randint(low, high, shape, generator=g).to(dtype)


def ramp(dist, *shape, dtype=torch.float64) -> torch.Tensor:
    """0, 1, 2, ... plus 100 x the rank: easy to read in a table of values."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=dtype) + 100 * dist.get_rank()).reshape(shape)
