"""p3 mistake: each gradient is all-reduced as a float32 copy "to halve the traffic" and copied back. The weights
are off by float32's rounding only (about 1e-8), which the float64 comparison sees; the half-size all-reduces are
what single the mistake out."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the gradients are all-reduced in float32, so the update carries float32's rounding error"
EXPECTED_FAILURES = {"averaged gradients", "updated weights"}
DIAGNOSIS = "communicated in float32"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for w1, w2 in layers:
        for w in (w1, w2):
            g = w.grad.float()
            dist.all_reduce(g, op=dist.ReduceOp.AVG)
            w.grad.copy_(g)
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr * w.grad
