"""p7 mistake: a good overlap, but the summed gradients are never divided by the world size."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "the summed gradients are never divided by the world size"
EXPECTED_FAILURES = {"updated weights"}
DIAGNOSIS = "summed across ranks, not averaged"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    pending = []
    hooks = [w.register_post_accumulate_grad_hook(lambda w: pending.append(dist.all_reduce(w.grad, async_op=True)))
             for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for work in pending:
        work.wait()
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr * w.grad
