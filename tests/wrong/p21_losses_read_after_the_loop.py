"""p21 fast, with the losses kept on the device through the loop, but turned into Python numbers once at the end
(.tolist()) and back into a tensor: one sync, after the loop. Cheap here, but the rule is that train reads no
number from the device: the caller logs the tensor it returns."""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import DataLoader

BATCH = 8

MISTAKE = "Reads the losses on the host after the loop (.tolist()): still a sync in train."
EXPECTED_FAILURES = {"no host sync"}
DIAGNOSIS = "tolist"


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
    logged = torch.stack(losses)
    dist.all_reduce(logged)
    return torch.tensor((logged / world).tolist(), dtype=torch.float64)
