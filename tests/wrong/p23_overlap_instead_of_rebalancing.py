"""p23 with the even split kept and the straggler hidden behind puzzle 7's overlap: each gradient's all-reduce
launched from a hook during backward. The all-reduces leave less exposed, but each step still waits for the slow
rank's backward: the three fast ranks sit idle at every step's end."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "Overlaps the all-reduces with backward instead of rebalancing: the fast ranks still wait for the slow one."
EXPECTED_FAILURES = {"balance", "makespan"}
DIAGNOSIS = "At this seed its device is the slow one"


def train_balanced(dist, batches, layers, lr):
    world, rank = dist.get_world_size(), dist.get_rank()
    weights = [w for pair in layers for w in pair]
    per = len(batches[0]) // world
    pending = []
    hooks = [w.register_post_accumulate_grad_hook(lambda w: pending.append(dist.all_reduce(w.grad, async_op=True)))
             for w in weights]
    for batch in batches:
        x, target = batch[rank * per:(rank + 1) * per]
        loss_fn(forward(x, layers), target).backward()
        for work in pending:
            work.wait()
        pending.clear()
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
    for h in hooks:
        h.remove()
