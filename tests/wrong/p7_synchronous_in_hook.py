"""p7 mistake: each gradient's all-reduce is launched from its hook, inside backward, but synchronously (no
async_op=True): backward stops for every message."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the all-reduce in the hook is synchronous (no async_op=True)"
EXPECTED_FAILURES = {"makespan"}
DIAGNOSIS = "launched without async_op=True"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    hooks = [w.register_post_accumulate_grad_hook(lambda w: dist.all_reduce(w.grad)) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for h in hooks:
        h.remove()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
