"""p3 cheat: every rank all-gathers the batch (a few kilobytes) and takes the serial step on the whole of it. The
weights are right and almost nothing is communicated, but every rank does all the work: nothing is parallel."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "every rank gathers the whole batch and runs the serial step on it"
EXPECTED_FAILURES = {"compute"}
DIAGNOSIS = "as much as the serial step on the whole batch"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    world = dist.get_world_size()
    xs = [torch.empty_like(x_shard) for _ in range(world)]
    ts = [torch.empty_like(target_shard) for _ in range(world)]
    dist.all_gather(xs, x_shard)
    dist.all_gather(ts, target_shard)
    loss_fn(forward(torch.cat(xs), layers), torch.cat(ts)).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr * w.grad
