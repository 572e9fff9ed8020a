"""p7 mistake: a good overlap, with ReduceOp.AVG, and then the update divides by the world size as well."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "averaged with ReduceOp.AVG and divided by the world size again"
EXPECTED_FAILURES = {"updated weights"}
DIAGNOSIS = "divided by 4 twice"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    pending = []
    hooks = [w.register_post_accumulate_grad_hook(
        lambda w: pending.append(dist.all_reduce(w.grad, op=dist.ReduceOp.AVG, async_op=True)))
        for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for work in pending:
        work.wait()
    for h in hooks:
        h.remove()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
