"""p3 mistake: all-reducing a copy of the gradient and stepping with the local one."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "a copy of the gradient is all-reduced and the step uses the local one"
EXPECTED_FAILURES = {"averaged gradients", "updated weights"}
DIAGNOSIS = "gradients were never all-reduced"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                g = w.grad.clone()
                dist.all_reduce(g, op=dist.ReduceOp.AVG)  # the average lands in g, which is then ignored
                w -= lr * w.grad
