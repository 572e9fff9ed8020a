"""A fix that remembers one seed: at seed 0 rank 3 is the slow one, so rank 3 gets 16 rows and the others 24, and
nothing is timed. At seed 7 rank 2 is slow: it gets 24 rows, and the others wait for it longer than before."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "Hard-codes the rank that was slow at one seed (rank 3 at seed 0) instead of timing the ranks."
EXPECTED_FAILURES = {"balance", "makespan"}
DIAGNOSIS = "At this seed its device is the slow one"

SLOW = 3
COUNTS = [16 if r == SLOW else 24 for r in range(4)]


def train_balanced(dist, batches, layers, lr):
    rank = dist.get_rank()
    weights = [w for pair in layers for w in pair]
    rows = len(batches[0])
    lo = sum(COUNTS[:rank])
    hi = lo + COUNTS[rank]
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
