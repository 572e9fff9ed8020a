"""p7 mistake: all gradients flattened into one bucket after backward and all-reduced asynchronously in one go:
one message instead of eight, but it can only start once backward is over."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "all gradients go in one flat bucket, all-reduced after backward"
EXPECTED_FAILURES = {"averaged gradients", "makespan"}
DIAGNOSIS = "started after backward had finished"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    weights = [w for pair in layers for w in pair]
    bucket = torch.cat([w.grad.reshape(-1) for w in weights])
    dist.all_reduce(bucket, async_op=True).wait()
    world = dist.get_world_size()
    offset = 0
    with torch.no_grad():
        for w in weights:
            w -= lr / world * bucket[offset:offset + w.numel()].view_as(w)
            offset += w.numel()
