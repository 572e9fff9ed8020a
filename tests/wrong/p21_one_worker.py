"""p21 with one loader worker: it loads in the background, but a batch takes 12,000 ticks of it, more than a
step's compute, so the loop waits for every batch: the worker is the bottleneck."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import DataLoader

BATCH = 8

MISTAKE = "One worker, slower than a step: the loop waits for data every step (more workers are needed)."
EXPECTED_FAILURES = {"makespan"}
DIAGNOSIS = "the loop waited for batches"


def train(dist, dataset, layers, lr):
    world = dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    pending = []

    def launch(w):
        pending.append(dist.all_reduce(w.grad, async_op=True))

    hooks = [w.register_post_accumulate_grad_hook(launch) for w in weights]
    losses = []
    for x, target in DataLoader(dataset, batch_size=BATCH, num_workers=1):
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
    logged = torch.stack(losses)
    dist.all_reduce(logged)
    return logged / world
