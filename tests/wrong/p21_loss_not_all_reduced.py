"""p21 fast and without syncs, but each rank logs its own loss (its 8 rows), never all-reduced: the log is not
the whole batch's loss, and it differs from rank to rank."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import DataLoader

BATCH = 8

MISTAKE = "The logged loss is each rank's own, not all-reduced over the ranks."
EXPECTED_FAILURES = {"logged losses"}
DIAGNOSIS = "this rank's own"


def train(dist, dataset, layers, lr):
    world = dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    pending = []

    def launch(w):
        pending.append(dist.all_reduce(w.grad, async_op=True))

    hooks = [w.register_post_accumulate_grad_hook(launch) for w in weights]
    losses = []
    for x, target in DataLoader(dataset, batch_size=BATCH, num_workers=2, prefetch_factor=2):
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        for work in pending:
            work.wait()
        pending.clear()
        losses.append(loss.detach())
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
    for h in hooks:
        h.remove()
    return torch.stack(losses)
