"""p3 mistake: `w -= lr * w.grad` with autograd recording: torch refuses to change a leaf that requires grad in
place (RuntimeError), and the error alone does not say what to do."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the weights updated in place without torch.no_grad() (autograd refuses an in-place change of a leaf)"
EXPECTED_STATUS = "error"
DIAGNOSIS = "do the update under `with torch.no_grad():`"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss = loss_fn(forward(x_shard, layers), target_shard)
    loss.backward()
    world = dist.get_world_size()
    for w1, w2 in layers:
        for w in (w1, w2):
            dist.all_reduce(w.grad)
            w.grad /= world
            w -= lr * w.grad
