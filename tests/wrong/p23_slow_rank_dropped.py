"""p23 with the slow rank found and then left out: the three fast ranks share the batch (30, 29, 29 rows) and the
slow rank adds zeros to each all-reduce. The weights are right and every row is read once, but the slow rank's
device, slower and not stopped, waits at every all-reduce, and the three others take longer than a balanced step."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import cuda

MISTAKE = "Finds the slow rank and gives it no rows: the others do all the work while it waits."
EXPECTED_FAILURES = {"balance", "makespan"}
DIAGNOSIS = "less work than its speed allows"


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
    times = probe_times(dist, layers)
    slowest = int(torch.argmax(times))
    others = [r for r in range(world) if r != slowest]
    counts = [0] * world
    for i, r in enumerate(others):
        counts[r] = rows // len(others) + (1 if i < rows % len(others) else 0)
    lo = sum(counts[:rank])
    hi = lo + counts[rank]
    for batch in batches:
        if hi > lo:
            x, target = batch[lo:hi]
            loss = loss_fn(forward(x, layers), target) * (hi - lo) / rows
            loss.backward()
        for w in weights:
            if w.grad is None:
                w.grad = torch.zeros_like(w)  # the slow rank's share: nothing
            dist.all_reduce(w.grad)
        with torch.no_grad():
            for w in weights:
                w -= lr * w.grad
                w.grad = None
