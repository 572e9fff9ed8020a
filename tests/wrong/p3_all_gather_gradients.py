"""p3 mistake: every rank all-gathers every gradient and averages the list itself. Right weights, but an
all-gather of N gradients sends twice what an all-reduce of one does."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the gradients are all-gathered and averaged locally instead of all-reduced"
EXPECTED_FAILURES = {"averaged gradients", "communication", "compute"}  # it sums N copies of every gradient itself
DIAGNOSIS = "used all_gather"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                parts = [torch.empty_like(w.grad) for _ in range(world)]
                dist.all_gather(parts, w.grad)
                w -= lr * torch.stack(parts).mean(0)
