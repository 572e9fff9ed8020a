"""p21 whose gradients are all-reduced (async) only after the whole backward, each weight updated as soon as its
own all-reduce ends: the short updates hide a little of the communication, the backward none. Found by a blind
attack."""
import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import DataLoader

MISTAKE = 'The all-reduces start after backward: nothing but the update runs under them.'
EXPECTED_FAILURES = {'overlap'}
DIAGNOSIS = 'issue each one during backward'

def train(dist, dataset, layers, lr):
    world = dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    losses = []
    for x, target in DataLoader(dataset, batch_size=8, num_workers=2, prefetch_factor=2):
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        works = [dist.all_reduce(w.grad, async_op=True) for w in reversed(weights)]  # after the whole backward
        losses.append(loss.detach())
        with torch.no_grad():
            for w, wk in zip(reversed(weights), works):
                wk.wait()
                w.sub_(w.grad, alpha=lr / world)
                w.grad = None
    out = torch.stack(losses)
    dist.all_reduce(out)
    return out / world
