"""Each rank has its own random-number stream, whatever the interleaving, and the caller's stream is left alone."""

import pytest
import torch

from puzzles import sim

N = 4


def draws_then_barrier(dist):
    """Every rank draws, meets the others, draws again."""
    a = torch.randn(3)
    dist.barrier()
    return torch.cat([a, torch.randn(3)])


def draws_in_reverse_rank_order(dist):
    """The same draws, but rank N-1 draws first and hands a token down to rank 0; then one more all-reduce."""
    r, token = dist.get_rank(), torch.zeros(1)
    if r < N - 1:
        dist.recv(token, r + 1)
    a = torch.randn(3)
    if r > 0:
        dist.send(token, r - 1)
    dist.all_reduce(token)
    return torch.cat([a, torch.randn(3)])


def test_each_rank_draws_its_own_numbers_whatever_the_interleaving():
    first = sim.run(draws_then_barrier, N).results
    again = sim.run(draws_then_barrier, N).results
    reordered = sim.run(draws_in_reverse_rank_order, N).results
    for r in range(N):
        assert torch.equal(first[r], again[r]), f"rank {r} drew differently on a second run"
        assert torch.equal(first[r], reordered[r]), f"rank {r}: {first[r]} then, interleaved otherwise, {reordered[r]}"
        for s in range(r):
            assert not torch.equal(first[r], first[s]), f"ranks {s} and {r} drew the same numbers"


def test_the_seed_changes_every_rank_stream():
    zero, one = (sim.run(draws_then_barrier, N, seed=seed).results for seed in (0, 1))
    assert all(not torch.equal(a, b) for a, b in zip(zero, one))


@pytest.mark.parametrize("fails", [False, True])
def test_run_leaves_the_callers_random_state_untouched(fails):
    def fn(dist):
        torch.manual_seed(99)  # a rank may even reseed its own stream
        x = torch.randn(5)
        if fails:
            raise RuntimeError("boom")
        dist.barrier()
        return x

    torch.manual_seed(1234)
    expected = torch.randn(4)
    torch.manual_seed(1234)
    if fails:
        with pytest.raises(RuntimeError, match="boom"):
            sim.run(fn, 2)
    else:
        sim.run(fn, 2)
    assert torch.equal(torch.randn(4), expected), "sim.run moved the caller's random-number generator"
