"""p23 with a probe timed on the first step's first 8 rows: every rank reads them, and after the split they are
rank 0's alone. The weights are right (the probe's gradients are thrown away), but the batch's rows are read by
more than one rank, which no job whose data is sharded can do."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import cuda

MISTAKE = "Times its probe on the batch's own rows, so every rank reads rows that are another rank's."
EXPECTED_FAILURES = {"every row once"}
DIAGNOSIS = "rows of its own"


def train_balanced(dist, batches, layers, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    weights = [w for pair in layers for w in pair]
    rows = len(batches[0])
    probe, _ = batches[0][0:8]
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    start.record()
    torch.autograd.grad(forward(probe, layers).sum(), weights)
    end.record()
    end.synchronize()
    times = torch.empty(world, dtype=torch.float64)
    dist.all_gather_into_tensor(times, torch.tensor([start.elapsed_time(end)], dtype=torch.float64))
    exact = rows * (1 / times) / (1 / times).sum()
    counts = exact.floor()
    counts[torch.argsort(exact - counts, descending=True, stable=True)[:rows - int(counts.sum())]] += 1
    bounds = [0] + torch.cumsum(counts, 0).long().tolist()
    lo, hi = bounds[rank], bounds[rank + 1]
    for batch in batches:
        x, target = batch[lo:hi]
        loss = loss_fn(forward(x, layers), target) * (hi - lo) / rows
        loss.backward()
        for w in weights:
            dist.all_reduce(w.grad)
        with torch.no_grad():
            for w in weights:
                w -= lr * w.grad
                w.grad = None
