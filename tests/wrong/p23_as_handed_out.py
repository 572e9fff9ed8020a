"""p23 as handed out: the stub with its first line deleted and nothing fixed."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "The program as handed out: an even split, so every step waits for the slow rank."
EXPECTED_FAILURES = {"balance", "makespan"}
DIAGNOSIS = "the others waited for rank"


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
