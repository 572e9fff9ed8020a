"""p3 mistake: only w1's gradients are all-reduced (the loop over the pair forgets w2), so w2 steps with each
rank's local gradient and the ranks drift apart."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the w2 gradients are never all-reduced"
EXPECTED_FAILURES = {"averaged gradients", "updated weights"}
DIAGNOSIS = "the gradients were never all-reduced"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            dist.all_reduce(w1.grad)
            w1 -= lr * w1.grad / world
            w2 -= lr * w2.grad
