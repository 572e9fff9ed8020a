"""p7 mistake: async all-reduces, but all launched after backward: they queue on the communication stream with
no compute left to hide behind (the same makespan as synchronous ones)."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "async all-reduces, all launched after backward"
EXPECTED_FAILURES = {"makespan"}
DIAGNOSIS = "started after backward had finished"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    works = [dist.all_reduce(w.grad, async_op=True) for pair in layers for w in pair]
    for work in works:
        work.wait()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
