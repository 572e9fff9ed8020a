"""p7 mistake: each hook launches an async all_gather of its gradient and the update averages the gathered list:
right weights, a good overlap of a sort, but an all-gather of N gradients sends twice what an all-reduce sends, and
the step takes longer."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the gradients are all-gathered (async, from hooks) and averaged locally instead of all-reduced"
EXPECTED_FAILURES = {"averaged gradients", "communication", "makespan", "compute"}  # it averages N copies itself
DIAGNOSIS = "used all_gather"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    world = dist.get_world_size()
    pending = []

    def launch(w):
        parts = [torch.empty_like(w.grad) for _ in range(world)]
        pending.append((dist.all_gather(parts, w.grad, async_op=True), parts, w))

    hooks = [w.register_post_accumulate_grad_hook(launch) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for work, parts, w in pending:
            work.wait()
            w -= lr * torch.stack(parts).mean(0)
