"""p21 with no sync and the loader's workers, but each gradient still all-reduced after the whole backward: the
compute stream waits for every all-reduce at every step (puzzle 3's step, not puzzle 7's)."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import DataLoader

BATCH = 8

MISTAKE = "Keeps the synchronous all-reduce after backward: nothing of the communication overlaps the compute."
EXPECTED_FAILURES = {"overlap", "makespan"}
DIAGNOSIS = "sat idle for"


def train(dist, dataset, layers, lr):
    world = dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    losses = []
    for x, target in DataLoader(dataset, batch_size=BATCH, num_workers=2, prefetch_factor=2):
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        for w in weights:
            dist.all_reduce(w.grad)
        losses.append(loss.detach())
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
    logged = torch.stack(losses)
    dist.all_reduce(logged)
    return logged / world
