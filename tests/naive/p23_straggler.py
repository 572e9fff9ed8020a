"""Naive p23: the program as handed out. Right weights, every row once, but an even split (22 rows a rank): the
three fast ranks wait for the slow one at every all-reduce, and the run is over its budget."""

import torch

from puzzles.model import forward, loss_fn

EXPECTED_FAILURES = {"balance", "makespan"}
DIAGNOSIS = "At this seed its device is the slow one"


def train_balanced(dist, batches, layers, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    weights = [w for pair in layers for w in pair]
    per = len(batches[0]) // world  # an even split: 22 rows each
    for batch in batches:
        x, target = batch[rank * per:(rank + 1) * per]
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        for w in weights:
            dist.all_reduce(w.grad)
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
