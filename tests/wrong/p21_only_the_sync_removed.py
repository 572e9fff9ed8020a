"""p21 with the .item() gone but the host still loading every batch (num_workers=0) and the all-reduces after the
whole backward: the host now runs ahead, but loading a batch takes longer than a step computes, so the device
waits for the host at every step."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import DataLoader

BATCH = 8

MISTAKE = "Removes the sync only: the loader still runs on the host and the all-reduce still follows the backward."
EXPECTED_FAILURES = {"overlap", "makespan"}
DIAGNOSIS = "the host loaded 6 batches itself"


def train(dist, dataset, layers, lr):
    world = dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    losses = []
    for x, target in DataLoader(dataset, batch_size=BATCH):
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
