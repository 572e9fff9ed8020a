"""p7 mistake: post-accumulate-grad hooks are registered, but each hook only notes that its weight is ready; the
async all-reduces are launched after backward, from the notes. A hook was used, yet nothing overlapped."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "hooks only record the ready weights; the all-reduces are launched after backward"
EXPECTED_FAILURES = {"makespan"}
DIAGNOSIS = "none was issued while backward ran"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    ready = []
    hooks = [w.register_post_accumulate_grad_hook(ready.append) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for h in hooks:
        h.remove()
    pending = [dist.all_reduce(w.grad, async_op=True) for w in ready]  # launched only now
    for work in pending:
        work.wait()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
