"""p3 mistake: each rank takes a local SGD step with its own gradient, then the weights are averaged across the
ranks. For one plain SGD step the averaged weights equal the data-parallel step (the update is linear in the
gradient), so the weights pass; but the gradients were never averaged (w.grad still holds the rank's own), which
the text asks for, and which momentum, Adam or gradient clipping would need."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "a local SGD step, then the weights averaged across the ranks (the gradients left local)"
EXPECTED_FAILURES = {"averaged gradients"}
DIAGNOSIS = "were the weights averaged instead"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr * w.grad
                dist.all_reduce(w)
                w /= world
