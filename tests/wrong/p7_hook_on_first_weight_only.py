"""p7 mistake: the hook that all-reduces is registered on each block's first weight only, and every gradient is
divided by the world size after backward. The second weights step with their own rank's gradient / N. Half the
bytes are sent, within the budget: only the values give it away."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "only w1 has the all-reduce hook, so w2's gradients are divided by N but never all-reduced"
EXPECTED_FAILURES = {"averaged gradients", "updated weights"}
DIAGNOSIS = "divided by the world size but never all-reduced"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    pending = []
    hooks = [w1.register_post_accumulate_grad_hook(
        lambda w: pending.append(dist.all_reduce(w.grad, async_op=True))) for w1, _ in layers]  # the mistake
    loss_fn(forward(x_shard, layers), target_shard).backward()
    while pending:
        pending.pop().wait()
    for h in hooks:
        h.remove()
    n = dist.get_world_size()
    with torch.no_grad():
        for pair in layers:
            for w in pair:
                w.sub_(lr * w.grad / n)
