"""p3 mistake: the gradients are averaged, and then the learning rate is multiplied by the world size ("4 ranks
see 4 times the data"): the step is 4 times too large, though w.grad holds the right average."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the gradients are averaged and the learning rate multiplied by the world size"
EXPECTED_FAILURES = {"updated weights"}
DIAGNOSIS = "the learning rate scaled by the world size"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad, op=dist.ReduceOp.AVG)
                w -= lr * world * w.grad
