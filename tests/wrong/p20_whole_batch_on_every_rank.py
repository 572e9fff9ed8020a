"""p20 without its gradient all-reduce: every rank all-gathers the batch (fewer bytes than the gradients) and
computes the whole step itself, every rank the same. Found by a blind attack."""
import torch

from puzzles.model import forward, loss_fn

MISTAKE = "Every rank gathers every rank's data and computes the whole batch's step itself: N times its share of the work, no gradient all-reduce."
EXPECTED_FAILURES = {"compute"}
DIAGNOSIS = "computed other ranks' rows too"

def train_step(dist, x, target, valid, layers, lr):
    world = dist.get_world_size()
    xs = [torch.empty_like(x) for _ in range(world)]
    ts = [torch.empty_like(target) for _ in range(world)]
    vs = [torch.empty_like(valid, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(xs, x.contiguous())
    dist.all_gather(ts, target.contiguous())
    dist.all_gather(vs, valid.to(torch.float64))
    X, T, V = torch.cat(xs), torch.cat(ts), torch.cat(vs)
    err = ((forward(X, layers) - T) ** 2).sum(dim=1)
    loss = (err * V).sum() / V.sum()
    loss.backward()
    with torch.no_grad():
        for pair in layers:
            for w in pair:
                w -= lr * w.grad
    return loss.detach()
