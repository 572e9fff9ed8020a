"""p3 mistake: only rank 0 steps into the all-reduce loop of one weight (the others skip it): a deadlock, named."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "only rank 0 all-reduces one of the weights: a deadlock"
EXPECTED_STATUS = "error"
DIAGNOSIS = "DeadlockError"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for i, (w1, w2) in enumerate(layers):
            for w in (w1, w2):
                if i == 0 and dist.get_rank() != 0:
                    continue
                dist.all_reduce(w.grad, op=dist.ReduceOp.AVG)
                w -= lr * w.grad
