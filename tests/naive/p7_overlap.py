"""Naive p7: puzzle 3's step, correct but synchronous: every all-reduce runs after backward and blocks, so the step
takes compute + all communication."""

import torch

from puzzles.model import forward, loss_fn

EXPECTED_FAILURES = {"makespan"}
DIAGNOSIS = "started after backward had finished"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad)
                w -= lr / world * w.grad
