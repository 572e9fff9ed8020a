"""p21 with no DataLoader: each batch sliced from dataset.tensors, so no sample is ever loaded (free data, which
no real job has: its samples come from disk). Found by a blind attack."""
import torch

from puzzles.model import forward, loss_fn

BATCH = 8

MISTAKE = "The data is read straight from dataset.tensors: nothing is loaded, so the loader's cost is skipped, not hidden."
EXPECTED_FAILURES = {'data loaded'}
DIAGNOSIS = 'Iterate over a DataLoader of the dataset'

def train(dist, dataset, layers, lr):
    world = dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    works = []
    hooks = [w.register_post_accumulate_grad_hook(lambda p: works.append(dist.all_reduce(p.grad, async_op=True)))
             for w in weights]
    X, T = dataset.tensors
    losses = []
    for s in range(X.shape[0] // BATCH):
        x, target = X[s * BATCH:(s + 1) * BATCH], T[s * BATCH:(s + 1) * BATCH]
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        for wk in works:
            wk.wait()
        works.clear()
        losses.append(loss.detach())
        with torch.no_grad():
            for w in weights:
                w.grad /= world
                w -= lr * w.grad
                w.grad = None
    for h in hooks:
        h.remove()
    out = torch.stack(losses)
    dist.all_reduce(out)
    return out / world
