"""p23 with the slow rank found and the rows split by speed (24, 24, 24, 16), but each rank's loss still its own
mean and the gradients averaged over the ranks: with shares of different sizes a mean of means is not the batch's
mean (the slow rank's rows weigh 1/(4·16) each, a fast rank's 1/(4·24))."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import cuda

MISTAKE = "Splits the rows by speed but averages the ranks' gradients of their own mean losses (a mean of means)."
EXPECTED_FAILURES = {"weights"}
DIAGNOSIS = "a mean of means"


def probe_times(dist, layers):
    """Every rank's time for a forward and backward on 8 rows of its own, in ms, the same tensor on every rank."""
    weights = [w for pair in layers for w in pair]
    probe = torch.zeros(8, layers[0][0].shape[0], dtype=torch.float64)
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    start.record()
    torch.autograd.grad(forward(probe, layers).sum(), weights)
    end.record()
    end.synchronize()
    mine = torch.tensor([start.elapsed_time(end)], dtype=torch.float64)
    times = torch.empty(dist.get_world_size(), dtype=torch.float64)
    dist.all_gather_into_tensor(times, mine)
    return times


def split(rows, times):
    """Rows in proportion to 1/time, adding up to `rows`: the bounds of each rank's range."""
    exact = rows * (1 / times) / (1 / times).sum()
    counts = exact.floor()
    left = rows - int(counts.sum())
    counts[torch.argsort(exact - counts, descending=True, stable=True)[:left]] += 1
    return [0] + torch.cumsum(counts, 0).long().tolist()


def train_balanced(dist, batches, layers, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    weights = [w for pair in layers for w in pair]
    bounds = split(len(batches[0]), probe_times(dist, layers))
    lo, hi = bounds[rank], bounds[rank + 1]
    for batch in batches:
        x, target = batch[lo:hi]
        loss = loss_fn(forward(x, layers), target)  # this rank's mean, as if the shares were equal
        loss.backward()
        for w in weights:
            dist.all_reduce(w.grad)
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
