"""p3 cheat (issue 18's first): an honest local step that supplies the FLOP count a matmul-only clock checked,
then the full-batch gradient computed again on every rank from all-gathered rows, with its products written as
broadcast multiplies and sums (free on that clock), and the weights set from it: no gradient is all-reduced.
Every op counts now: the elementwise products are the whole batch's step again, far over the compute budget."""

import torch
import torch.nn.functional as F

from puzzles.model import forward, loss_fn

MISTAKE = ("an honest local backward for the FLOP count, then the full batch's gradient by broadcast multiplies and "
           "sums on every rank instead of an all-reduce")
EXPECTED_FAILURES = {"compute"}
DIAGNOSIS = "products written as elementwise multiplies and sums"


def matmul(a, b):
    return (a[:, :, None] * b[None, :, :]).sum(1)  # a @ b, element by element


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()  # the honest share: its matmuls meet the floor
    world = dist.get_world_size()
    xs = [torch.empty_like(x_shard) for _ in range(world)]
    ts = [torch.empty_like(target_shard) for _ in range(world)]
    dist.all_gather(xs, x_shard)
    dist.all_gather(ts, target_shard)
    copies = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
    x = torch.cat(xs)
    for w1, w2 in copies:
        x = x + matmul(F.gelu(matmul(x, w1)), w2)
    loss_fn(x, torch.cat(ts)).backward()
    with torch.no_grad():
        for (w1, w2), (c1, c2) in zip(layers, copies):
            w1 -= lr * c1.grad
            w2 -= lr * c2.grad
            w1.grad = c1.grad
            w2.grad = c2.grad
