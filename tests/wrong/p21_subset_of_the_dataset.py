"""p21 loading through torch.utils.data.Subset of the dataset with num_workers=0 and the all-reduce after
backward: the samples read through the Subset cost their load as any others do. Found by a blind attack."""
import torch

from torch.utils.data import Subset

from puzzles.model import forward, loss_fn
from puzzles.sim import DataLoader

BATCH = 8

MISTAKE = 'A Subset is still the dataset: its samples cost their load; the host loads them itself and the all-reduces run after backward.'
EXPECTED_FAILURES = {'overlap', 'makespan'}
DIAGNOSIS = 'issue each one during backward'

def train(dist, dataset, layers, lr):
    world = dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    rows = Subset(dataset, range(len(dataset)))  # torch.utils.data.Subset: no ticks_per_sample
    losses = []
    for x, target in DataLoader(rows, batch_size=BATCH):
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        for w in weights:
            dist.all_reduce(w.grad)  # after the whole backward: nothing overlaps it
        losses.append(loss.detach())
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
    out = torch.stack(losses)
    dist.all_reduce(out)
    return out / world
