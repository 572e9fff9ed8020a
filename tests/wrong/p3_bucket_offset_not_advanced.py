"""p3 mistake: the gradients all-reduced in one flat bucket, but the offset into it is never advanced: every
weight takes (as its .grad and its update) the first weight's slice, whose size happens to fit."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the offset into the flat bucket is never advanced: every weight reads the first weight's slice"
EXPECTED_FAILURES = {"updated weights", "averaged gradients"}
DIAGNOSIS = "Is the offset advanced past each weight"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    weights = [w for pair in layers for w in pair]
    with torch.no_grad():
        bucket = torch.cat([w.grad.reshape(-1) for w in weights])
        dist.all_reduce(bucket)
        bucket /= dist.get_world_size()
        offset = 0
        for w in weights:
            w.grad = bucket[offset:offset + w.numel()].view_as(w)
            w -= lr * w.grad
