"""p3, another style: the all-reduce averages by itself (ReduceOp.AVG), so the update needs no division."""

import torch

from puzzles.model import forward, loss_fn


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad, op=dist.ReduceOp.AVG)
                w -= lr * w.grad
