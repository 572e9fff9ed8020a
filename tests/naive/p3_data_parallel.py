"""Naive p3: sums the gradients across ranks instead of averaging them (the most common data-parallel mistake)."""

import torch

from puzzles.model import forward, loss_fn

EXPECTED_FAILURES = {"updated weights", "averaged gradients"}
DIAGNOSIS = "summed across ranks, not averaged"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w -= lr * w.grad
