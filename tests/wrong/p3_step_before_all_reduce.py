"""p3 mistake: the update is applied with the local gradient, and the gradient is averaged afterwards: w.grad ends
up right, but too late for the step."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "each weight is updated with its local gradient before the gradient is averaged"
EXPECTED_FAILURES = {"updated weights"}
DIAGNOSIS = "updated before the all-reduce's result was there"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr * w.grad
                dist.all_reduce(w.grad, op=dist.ReduceOp.AVG)
