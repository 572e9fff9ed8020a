"""p7 mistake: the all-reduce is launched from inside backward, but waited for right away, so backward stalls for
every message: no overlap."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "each all-reduce is waited for inside the hook that launched it"
EXPECTED_FAILURES = {"makespan"}
DIAGNOSIS = "waited for right after it was launched"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    def launch(w):
        dist.all_reduce(w.grad, async_op=True).wait()

    hooks = [w.register_post_accumulate_grad_hook(launch) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for h in hooks:
        h.remove()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
