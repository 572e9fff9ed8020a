"""p7 mistake: the post-accumulate-grad hooks are never removed. This step is right, but the hooks stay on the
weights: the next backward (the next step's) fires them again, on top of whatever that step registers, and each
gradient is all-reduced twice (or its handle is lost)."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the gradient hooks are left registered after the step"
EXPECTED_FAILURES = {"hooks removed"}
DIAGNOSIS = "remove them before returning"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    pending = []

    def launch(w):
        pending.append(dist.all_reduce(w.grad, async_op=True))

    for pair in layers:
        for w in pair:
            w.register_post_accumulate_grad_hook(launch)  # the handle is dropped: no way to remove it
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for work in pending:
        work.wait()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
