"""p23 with the slow rank found and its rows skipped: the even split (22 rows a rank), but the slow rank reads none
and adds zeros, so 22 rows of every step are nobody's. Fast, and wrong: the step is not the whole batch's."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import cuda

MISTAKE = "Finds the slow rank and skips its rows: a quarter of every batch is never learned from."
EXPECTED_FAILURES = {"weights", "every row once", "balance"}
DIAGNOSIS = "the slow one at this seed, read no row"


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
    rows = len(batches[0])
    per = rows // world
    slowest = int(torch.argmax(probe_times(dist, layers)))
    for batch in batches:
        if rank != slowest:
            x, target = batch[rank * per:(rank + 1) * per]
            loss = loss_fn(forward(x, layers), target) * per / (rows - per)  # the rows that are left
            loss.backward()
        for w in weights:
            if w.grad is None:
                w.grad = torch.zeros_like(w)
            dist.all_reduce(w.grad)
        with torch.no_grad():
            for w in weights:
                w -= lr * w.grad
                w.grad = None
