"""p3 mistake: averaging with ReduceOp.AVG and then dividing by the world size again."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "averaged with ReduceOp.AVG and divided by the world size again"
EXPECTED_FAILURES = {"updated weights"}
DIAGNOSIS = "divided by 4 twice"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad, op=dist.ReduceOp.AVG)
                w -= lr * w.grad / dist.get_world_size()
